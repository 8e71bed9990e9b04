#!/usr/bin/env python
"""Autoscaler benchmark: wake-up time from zero, and the autoscaler's idle footprint.

usage: python benchmarks/autoscaler_bench.py [--tries 20] [--idle 30]

Wake-up: `conveyor autoscaler` runs one local target on the embedded default (SQLite in a
temp dir), polling every 5 s (the default) with a zero cooldown. Each try waits until the
target is at zero with no worker process left, publishes one task to the empty queue at a
random moment of the polling cycle, and times publish -> worker process started (its
/proc start time, 10 ms resolution) -> task started (the time the task itself wrote).
KEDA polls every 30 s by default; the issue's target is under 1 s. The wake-ups counter
shows how many scale-ups the broker watch made, as opposed to a poll.

Footprint: the same autoscaler idle at zero (watching the queue) for --idle seconds: CPU
as % of one core (utime + stime from /proc), memory as PSS and RSS. Also the PSS the
Kubernetes client adds when a kubernetes target is configured (imported only then).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.message import Message

ROOT = Path(__file__).parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def started_at(pid: int) -> float:
    """When a process started, in seconds since boot (CLOCK_BOOTTIME), to a clock tick."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / TICK


def since_boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory_kib(pid: int) -> dict[str, int]:
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return {k: int(v) for k, v in re.findall(r"^(Pss|Rss):\s+(\d+) kB", rollup, re.M)}


def metric(port: int, name: str) -> float:
    text = _text(port)
    match = re.search(rf'^{name}(?:_total)?{{target="bench"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def start_autoscaler(tmp: Path, url: str, queue: str, port: int) -> subprocess.Popen[bytes]:
    config = tmp / "autoscaler.toml"
    config.write_text(f'broker_url = "{url}"\nmetrics_port = {port}\n'
                      f'metrics_addr = "127.0.0.1"\n[targets.bench]\nkind = "local"\n'
                      f'queues = ["{queue}"]\nslots_per_replica = 1\nmax_replicas = 1\n'
                      f"polling_interval = 5\ncooldown = 0\nstabilization_window = 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = f"{ROOT / 'src'}:{ROOT}"
    log = open(tmp / "autoscaler.log", "wb")  # noqa: SIM115 (the child holds it)
    return subprocess.Popen([sys.executable, "-m", "conveyor.cli", "autoscaler",
                             f"--config={config}"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: {what} did not happen within {timeout}s")
        time.sleep(0.002)


def one_try(client: Client, proc: subprocess.Popen[bytes], queue: str,
            stamp: Path) -> tuple[float, float]:
    """(publish -> worker process started, publish -> task started) in seconds."""
    wait(lambda: not children(proc.pid), 60, "scale to zero")
    time.sleep(random.uniform(0.2, 1.2))  # land anywhere in the polling cycle
    stamp.unlink(missing_ok=True)
    published, published_boot = time.time(), since_boot()
    client.enqueue(Message(queue=queue, command=("sh", "-c", f"date +%s.%N > {stamp}")))
    wait(lambda: children(proc.pid), 30, "a worker start")
    worker = started_at(children(proc.pid)[0])
    wait(lambda: stamp.exists() and stamp.read_text().strip(), 30, "the task start")
    return worker - published_boot, float(stamp.read_text()) - published


def idle_footprint(pid: int, seconds: float) -> tuple[float, dict[str, int]]:
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - t0) * 100, memory_kib(pid)


def kubernetes_client_pss() -> float:
    """MiB of PSS that importing the Kubernetes target adds to the autoscaler."""
    probe = ("import re, sys, pathlib; import conveyor.autoscaler.daemon\n"
             "def pss(): return int(re.search(r'^Pss:\\s+(\\d+)', pathlib.Path("
             "'/proc/self/smaps_rollup').read_text(), re.M).group(1))\n"
             "a = pss(); import conveyor.autoscaler.targets.kubernetes; print(pss() - a)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=True)
    return int(out.stdout) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url, queue, port = f"sqlite:///{tmp}/broker.db", "bench", _free_port()
        broker = from_url(url)
        proc = start_autoscaler(tmp, url, queue, port)
        try:
            client = Client(broker)
            wait(lambda: _at_zero(port), 60, "the autoscaler's first evaluation")
            results = [one_try(client, proc, queue, tmp / "stamp") for _ in range(args.tries)]
            wait(lambda: not children(proc.pid), 60, "scale to zero")
            wakeups = metric(port, "conveyor_autoscaler_wakeups")
            cpu, mem = idle_footprint(proc.pid, args.idle)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            broker.close()
    report(results, wakeups, cpu, mem, kubernetes_client_pss())


def report(results: list[tuple[float, float]], wakeups: float, cpu: float,
           mem: dict[str, int], k8s_mib: float) -> None:
    spawn = sorted(r[0] for r in results)
    start = sorted(r[1] for r in results)

    def line(label: str, xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else xs * 9
        return (f"  {label:<44} p50 {statistics.median(xs) * 1000:7.1f} ms   "
                f"p90 {q[8] * 1000:7.1f} ms   max {max(xs) * 1000:7.1f} ms")

    print(f"wake-up from zero, local target, embedded SQLite, {len(results)} tries "
          f"(polling interval 5 s; {wakeups:.0f} woken by the broker watch):")
    print(line("publish -> worker process started (±10 ms)", spawn))
    print(line("publish -> task started", start))
    print(f"idle autoscaler at zero: CPU {cpu:.3f}% of one core, PSS "
          f"{mem['Pss'] / 1024:.1f} MiB, RSS {mem['Rss'] / 1024:.1f} MiB "
          f"(+{k8s_mib:.1f} MiB PSS with a kubernetes target)")


def _at_zero(port: int) -> bool:
    try:
        return metric(port, "conveyor_autoscaler_replicas") == 0.0 and \
            "conveyor_autoscaler_replicas{" in _text(port)
    except OSError:
        return False


def _text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    main()
