#!/usr/bin/env python
"""CPU per task of a worker, start-up cancelled out, and where it goes process by process:
less sensitive to a loaded machine than a drain rate.

usage (from the project root, after ../shared/peers/setup.sh and
`/tmp/peers-venv/bin/pip install -e .`):

    BENCH_COUNTER_URL=redis://127.0.0.1:6379/13 PYTHONPATH=benchmarks:../shared/peers \
        /tmp/peers-venv/bin/python benchmarks/worker_cpu.py CONFIG [--small 300] [--large 1500]

CONFIG is what `../shared/peers/bench.py` takes (`celery-redis`, `module:p_conveyor:redis`,
`module:p_conveyor:rabbitmq-reuse100`, ...). It queues `--large` no-op tasks with the peer's
own API, starts its worker and, once `--small` tasks have run (start-up is then over), reads
the CPU time (user + system) of every process of the worker's tree from /proc/<pid>/stat,
and again when the last task body has run: the difference divided by the tasks in between
is the worker's CPU per task, and their rate its steady drain rate. (Not `wait4` on the
worker: Conveyor's zygote never reaps its lanes, so the supervisor's rusage misses every
lane and runner.) Under CPU contention (2 cores shared with other jobs) CPU per task
decides throughput more than any wait does. Set OLD_SRC=/path/to/other/src: to run another
checkout's code in the worker with the same interpreter (a same-run before/after).

Per process kind: user + system time of each live process of the worker's tree, plus what
the processes that reaped children were charged for them (cutime + cstime: a Conveyor
lane's reaped runners, RQ's work-horses), and the Redis server's own CPU over the same
window (shared with whatever else uses it on this machine: read it on a quiet Redis). A
Conveyor tree is named by role: supervisor, zygote, lanes, runners (reaped by the lanes);
others by their depth in the tree.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers")
TICK = os.sysconf("SC_CLK_TCK")


class Stat(NamedTuple):
    """One process's counters: its own, and those of the children it reaped."""

    start: int  # start time (ticks since boot): tells a recycled pid apart
    cpu: float  # user + system seconds
    reaped_cpu: float
    faults: int  # minor page faults (mostly copy-on-write after a fork)
    reaped_faults: int


def stat(pid: int) -> Stat:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return Stat(int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK,
                (int(fields[13]) + int(fields[14])) / TICK, int(fields[7]), int(fields[8]))


def tree(root: int) -> dict[int, tuple[Stat, str]]:
    """Every live process under `root` (included): pid -> (its counters, its role)."""
    found: dict[int, tuple[Stat, str]] = {}
    todo = [(root, 0)]
    parents: dict[int, str] = {}
    while todo:
        pid, depth = todo.pop()
        try:
            counters = stat(pid)
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            children = [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                        for c in (t / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        found[pid] = (counters, role(argv, depth, parents.get(pid, "")))
        parents.update((c, found[pid][1]) for c in children)
        todo += [(c, depth + 1) for c in children]
    return found


def role(argv: list[bytes], depth: int, parent_role: str) -> str:
    line = b" ".join(argv).decode(errors="replace")
    if depth == 0:
        return "supervisor" if "conveyor" in line else "main"
    if "conveyor.worker.zygote" in line and parent_role == "supervisor":
        return "zygote"
    if parent_role == "zygote":
        return "lanes"
    if parent_role == "lanes":
        return "runners (live)"
    return "children" if depth == 1 else f"depth {depth}"


def redis_server() -> Stat:
    """The local Redis server's counters (zero if it cannot be found)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "redis-server":
                    return stat(int(entry.name))
            except OSError:
                continue
    return Stat(0, 0.0, 0.0, 0, 0)


Snapshot = tuple[dict[int, tuple[Stat, str]], Stat, float]
Row = tuple[str, float, float, int]  # kind, CPU ms per task, faults per task, processes


def snapshot(root: int) -> Snapshot:
    return tree(root), redis_server(), time.monotonic()


def breakdown(a: Snapshot, b: Snapshot, tasks: int) -> list[Row]:
    """Per kind, CPU and page faults per task between two snapshots of the same tree.

    A process in both counts its own difference; one born in between counts all of it.
    Children reaped in between count under their reaper's kind (a lane's: "runners").
    """
    cpu: dict[str, float] = collections.defaultdict(float)
    faults: dict[str, int] = collections.defaultdict(int)
    count: collections.Counter[str] = collections.Counter()
    zero = Stat(0, 0.0, 0.0, 0, 0)
    for pid, (now, kind) in b[0].items():
        old = a[0].get(pid, (zero, ""))[0]
        old = old if old.start == now.start else zero
        cpu[kind] += now.cpu - old.cpu
        faults[kind] += now.faults - old.faults
        count[kind] += 1
        reaper = "runners (reaped)" if kind == "lanes" else f"reaped by {kind}"
        cpu[reaper] += now.reaped_cpu - old.reaped_cpu
        faults[reaper] += now.reaped_faults - old.reaped_faults
    cpu["redis-server"] = b[1].cpu - a[1].cpu
    faults["redis-server"] = b[1].faults - a[1].faults
    rows = [(kind, ms / tasks * 1e3, faults[kind] / tasks, count.get(kind, 1))
            for kind, ms in cpu.items() if ms > 0 or count.get(kind)]
    return sorted(rows, key=lambda r: -r[1])


def drain(config: str, n: int, mark: int) -> tuple[float, list[Row]]:
    """(tasks/s between the `mark`-th and the n-th task, per-kind CPU ms per task there)."""
    import bench  # type: ignore[import-not-found]  # the peers harness
    import common  # type: ignore[import-not-found]

    module, env, variant, _ = bench.resolve(config)
    os.environ.update(env)
    spec: Any = importlib.import_module(module).Spec(variant)
    spec.setup()
    spec.purge()
    counter = common.client()
    counter.delete(common.K_DONE, common.K_FIRST, common.K_LAST)
    spec.enqueue_noop(n)
    cmd = spec.worker_cmds()[0]
    exe = os.path.join(bench.VENV_BIN, cmd[0])
    if os.path.exists(exe):
        cmd = [exe, *cmd[1:]]
    worker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    first: Snapshot | None = None
    done = first_done = 0
    while done < n:
        done = int(counter.get(common.K_DONE) or 0)
        if first is None and done >= mark:
            first, first_done = snapshot(worker.pid), done
        time.sleep(0.005)
    last = snapshot(worker.pid)
    worker.send_signal(signal.SIGTERM if config.startswith("celery") else signal.SIGINT)
    worker.wait()
    assert first is not None
    return (done - first_done) / (last[2] - first[2]), breakdown(first, last, done - first_done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--small", type=int, default=300, help="tasks before measuring")
    parser.add_argument("--large", type=int, default=1500, help="tasks in all")
    args = parser.parse_args()
    peers = os.environ.get("PEERS_DIR", PEERS)
    sys.path[:0] = [peers]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("OLD_SRC", "").rstrip(":"), peers,
                    os.environ.get("PYTHONPATH", "")) if p)
    load = open("/proc/loadavg").read().split()[0]
    rate, rows = drain(args.config, args.large, args.small)
    own = sum(ms for kind, ms, _, _ in rows if kind != "redis-server")
    print(f"{args.config}: {own:.2f} ms CPU per task (worker tree), {rate:.0f} tasks/s "
          f"(tasks {args.small}-{args.large}); load average {load} -> "
          f"{open('/proc/loadavg').read().split()[0]}")
    print(f"  {'process kind':<20}{'CPU ms/task':>12}{'faults/task':>12}{'processes':>11}")
    for kind, ms, faults, count in rows:
        print(f"  {kind:<20}{ms:>12.3f}{faults:>12.0f}{count:>11}")


if __name__ == "__main__":
    main()
