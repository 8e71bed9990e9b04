#!/usr/bin/env python
"""How long a task outlives its SIGKILLed worker, and how soon its redelivery starts.

usage: python benchmarks/orphan_bench.py [BROKER ...] [--kills 50] [--bounces 8]
                                        [--realtime] [--no-sys-nice [--rtprio N]]
BROKER: sqlite, postgres, redis, rabbitmq (default: all four).

`--no-sys-nice` starts the workers without CAP_SYS_NICE (through setpriv, from root: the
capability leaves the bounding set, so the worker is root without it, as in deploy/k8s) and
`--rtprio N` under that RLIMIT_RTPRIO (prlimit: raising it past the hard limit needs
CAP_SYS_RESOURCE). Without the capability and with RLIMIT_RTPRIO 0, the worker's start line
says "runner teardown: ordinary priority" and this measures the slow path.

One message runs a task that appends `<pid> <CLOCK_MONOTONIC ns>` to a ledger every
millisecond until told to stop. A second worker is started as a standby, then the worker
running the task is SIGKILLed: the standby gets the redelivery (after the lease on sqlite,
postgres and redis; when the dead worker's connection closes on RabbitMQ) and becomes the
next one killed. The message bounces `--bounces` times, then a fresh one takes over (RabbitMQ's
delivery limit). Per kill it records:

  worker   kill -> the worker itself has exited (a pidfd of it polled by this process)
  gone     kill -> the orphaned runner has exited (likewise)
  late     kill -> the orphan's last ledger line (negative: nothing written after the kill)
  gap      the orphan's last ledger line -> the redelivered run's first (negative: overlap)

and prints p50/p99/max of each per broker, how many kills had a late write or an overlap, and
for each runner not gone 5 ms after the kill, its state then (D: in a disk write, which no
signal interrupts).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.broker import Broker, from_url
from conveyor.client import Client
from conveyor.message import Message

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from tests.conftest import clean_transport  # noqa: E402
from tests.contract.conftest import TRANSPORTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SLOW_MS = 5
TASKS = '''
import os, time
from conveyor.tasks import task

@task(name="bench.ledger")
def ledger(path: str, stop: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    pid, lines = os.getpid(), 0
    while not os.path.exists(stop):
        os.write(fd, b"%d %d\\n" % (pid, time.monotonic_ns()))
        lines += 1
        time.sleep(0.001)
    return lines
'''


@dataclass
class Figures:
    worker: list[float] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)  # where runners not gone by SLOW_MS were
    gone: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)
    gap: list[float] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def unprivileged(rtprio: int | None) -> list[str]:
    """The argv prefix that starts a worker without CAP_SYS_NICE (and under RLIMIT_RTPRIO
    `rtprio`, if given)."""
    drop = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]
    return drop if rtprio is None else ["prlimit", f"--rtprio={rtprio}", *drop]


class Bench:
    def __init__(self, name: str, tmp: Path, unique: str, prefix: list[str]) -> None:
        self.prefix = prefix
        self.tmp, self.queue = tmp, f"orphan-{unique}"
        self.url = TRANSPORTS[name][1](tmp, unique)
        (tmp / "orphan_tasks.py").write_text(TASKS)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        self.env.update({"CONVEYOR_BROKER_URL": self.url, "CONVEYOR_LOG_LEVEL": "INFO",
                         "PYTHONPATH": f"{ROOT / 'src'}:{tmp}"})
        self.broker: Broker = from_url(self.url)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.messages = 0

    def start_worker(self) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"worker-{len(self.workers)}.log"
        argv = [*self.prefix, sys.executable, "-m", "conveyor.cli", "worker",
                f"--queues={self.queue}", "--app=orphan_tasks", "--concurrency=1",
                "--heartbeat-interval=1",
                "--max-deliveries=1000"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=self.tmp, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.workers.append(proc)
        return proc, log

    def wait_consuming(self, log: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while b" consuming " not in log.read_bytes():
            if time.monotonic() > deadline:
                raise SystemExit(f"no worker consuming within {timeout}s:\n{log.read_text()}")
            time.sleep(0.02)

    def enqueue(self) -> tuple[Path, Path]:
        self.messages += 1
        ledger = self.tmp / f"ledger-{self.messages}"
        stop = self.tmp / f"stop-{self.messages}"
        ledger.touch()
        Client(self.broker).enqueue(Message(queue=self.queue, task="bench.ledger",
                                            args=(str(ledger), str(stop))))
        return ledger, stop

    def close(self) -> None:
        for n in range(1, self.messages + 1):
            (self.tmp / f"stop-{n}").touch()
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.broker.purge(self.queue)
        self.broker.close()


def ledger_lines(ledger: Path) -> list[tuple[int, int]]:
    lines = []
    for line in ledger.read_bytes().splitlines():
        parts = line.split()
        if len(parts) == 2:
            lines.append((int(parts[0]), int(parts[1])))
    return lines


def wait_new_runner(ledger: Path, not_these: set[int], timeout: float) -> tuple[int, int]:
    """(pid, first timestamp) of the first run in the ledger whose pid is new."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, stamp in ledger_lines(ledger):
            if pid not in not_these:
                return pid, stamp
        time.sleep(0.005)
    raise SystemExit(f"no run of {ledger.name} started within {timeout}s")


def kill_and_watch(worker: subprocess.Popen[bytes], runner: int,
                   figures: Figures) -> tuple[int, int, int]:
    """SIGKILL the worker; (the kill's time, the time the worker was seen gone, the time
    its runner was), in ns. Each is seen gone when a pidfd of it polls readable. A runner
    still there after SLOW_MS is looked at once (its state and where it waits in the kernel)."""
    fds = {os.pidfd_open(worker.pid): "worker", os.pidfd_open(runner): "runner"}
    seen: dict[str, int] = {}
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        killed = time.monotonic_ns()
        os.kill(worker.pid, signal.SIGKILL)
        looked = False
        while len(seen) < 2:
            ready = poller.poll(SLOW_MS if not looked else 5000)
            if not ready and not looked:
                looked = True
                if "runner" not in seen:
                    figures.slow.append(where(runner))
                continue
            if not ready:
                raise SystemExit(f"{sorted({'worker', 'runner'} - set(seen))} still alive 5 s "
                                 f"after the worker's SIGKILL")
            for fd, _ in ready:
                seen.setdefault(fds[fd], time.monotonic_ns())
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)
    worker.wait()
    return killed, seen["worker"], seen["runner"]


def where(pid: int) -> str:
    """`<state> <wchan>` of a process: R running, D in uninterruptible sleep (disk I/O)..."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text() or "-"
    except OSError:
        return "gone meanwhile"
    return f"{state} {wchan}"


def run(name: str, kills: int, bounces: int, prefix: list[str]) -> Figures:
    figures = Figures()
    unique = "t" + uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="orphan-bench-") as tmp:
        bench = Bench(name, Path(tmp), unique, prefix)
        try:
            current, log = bench.start_worker()
            bench.wait_consuming(log)
            teardown = log.read_text().split("runner teardown: ", 1)[-1].split("\n")[0]
            print(f"{name}: the worker's runner teardown: {teardown}", flush=True)
            ledger, stop = bench.enqueue()
            seen: set[int] = set()
            runner, _ = wait_new_runner(ledger, seen, 60)
            for k in range(kills):
                standby, log = bench.start_worker()
                bench.wait_consuming(log)
                time.sleep(random.uniform(0.02, 0.08))
                seen.add(runner)
                killed, dead, gone = kill_and_watch(current, runner, figures)
                new, first = wait_new_runner(ledger, seen, 60)
                last = max(t for pid, t in ledger_lines(ledger) if pid == runner)
                figures.worker.append((dead - killed) / 1e6)
                figures.gone.append((gone - killed) / 1e6)
                figures.late.append((last - killed) / 1e6)
                figures.gap.append((first - last) / 1e6)
                current, runner = standby, new
                if (k + 1) % bounces == 0 and k + 1 < kills:
                    stop.touch()
                    ledger, stop = bench.enqueue()
                    runner, _ = wait_new_runner(ledger, set(), 60)
                    seen = set()
        finally:
            bench.close()
            clean_transport(name, unique)
    return figures


def summary(name: str, figures: Figures) -> str:
    def three(values: list[float]) -> str:
        return (f"p50 {percentile(values, 0.5):7.1f}  p99 {percentile(values, 0.99):7.1f}  "
                f"max {max(values):7.1f}")
    late = sum(1 for v in figures.late if v > 0)
    overlaps = sum(1 for v in figures.gap if v <= 0)
    return (f"{name:9} kills {len(figures.gone):3}\n"
            f"  worker(ms) {three(figures.worker)}   (kill -> the worker's own exit)\n"
            f"  gone  (ms) {three(figures.gone)}\n"
            f"  late  (ms) {three(figures.late)}   written after the kill: {late}\n"
            f"  gap   (ms) {three(figures.gap)}   overlaps: {overlaps}"
            + "".join(f"\n  not gone after {SLOW_MS} ms: {n} x {what}"
                      for what, n in collections.Counter(figures.slow).most_common()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("brokers", nargs="*", default=["sqlite", "postgres", "redis",
                                                       "rabbitmq"])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--bounces", type=int, default=8)
    parser.add_argument("--realtime", action="store_true",
                        help="measure from a SCHED_FIFO process (root): takes this "
                             "process's own wake-up latency out of the figures")
    parser.add_argument("--no-sys-nice", action="store_true",
                        help="start the workers without CAP_SYS_NICE (setpriv; run as root)")
    parser.add_argument("--rtprio", type=int, default=None,
                        help="with --no-sys-nice: the workers' RLIMIT_RTPRIO (prlimit)")
    args = parser.parse_args()
    if args.rtprio is not None and not args.no_sys_nice:
        parser.error("--rtprio needs --no-sys-nice (root may use SCHED_FIFO whatever it is)")
    prefix = unprivileged(args.rtprio) if args.no_sys_nice else []
    if args.realtime:
        # reset on fork: the workers it starts must run at the ordinary priority
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(50))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; workers: "
          f"{' '.join(prefix) or 'as this process'}")
    for name in args.brokers:
        print(summary(name, run(name, args.kills, args.bounces, prefix)), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
