"""What isolation adds to starting a task: fork, cgroup entry, non-dumpable, slot setup.

    python benchmarks/fork_cost.py [--iterations 200] [--ballast 200000] [--force rlimit]

Prints medians (and p90) in milliseconds, without and with gc.freeze() before forking:

  bare fork+exit+waitpid            the floor: fork, an empty child, reaping it
  fork+enter+non_dumpable+exit      the same with slot.enter() and make_non_dumpable()
    enter (in child), back-to-back  slot.enter() alone, forks following each other closely
    enter (in child), after idle    slot.enter() alone after a pause, as for sporadic tasks
    non_dumpable (in child)         make_non_dumpable() alone
  fork+gc.collect()+exit            a child that runs one collection: without gc.freeze()
                                    it writes to every tracked object's header, copying pages
  prepare+remove                    creating and removing one task's cgroup (supervisor side)

Moving a process between cgroups takes the kernel's global cgroup_threadgroup_rwsem for
writing, which waits for an RCU grace period unless another move happened moments before:
that is why "after idle" costs milliseconds while "back-to-back" costs a tenth of one.
Pre-admitting runners forked ahead (slot.admit, then slot.set_limit when the task arrives),
CLONE_INTO_CGROUP (v2), or the favordynmods mount option take it off the task's path.

The parent holds `--ballast` small dicts, a stand-in for a worker's imported modules.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import struct
import sys
import time
from collections.abc import Callable

from conveyor.worker import cgroups, isolation

MiB = 1 << 20
Child = Callable[[int], None]


def fork_once(child: Child, report: int) -> float:
    """Fork, run `child` (which may write 8 bytes to `report`), reap; the parent's ms."""
    start = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:
        try:
            child(report)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return (time.perf_counter_ns() - start) / 1e6


def timed_ns(fn: Callable[[], object]) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def run(child: Child, iterations: int, gap: float = 0.0,
        reports: int = 0) -> tuple[list[float], list[list[float]]]:
    """Fork `iterations` times; also collect `reports` nanosecond timings each child sent."""
    read_fd, write_fd = os.pipe()
    parent_ms: list[float] = []
    child_ms: list[list[float]] = [[] for _ in range(reports)]
    try:
        for _ in range(iterations):
            if gap:
                time.sleep(gap)
            parent_ms.append(fork_once(child, write_fd))
            for series in child_ms:
                series.append(struct.unpack("q", os.read(read_fd, 8))[0] / 1e6)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    return parent_ms, child_ms


def summary(label: str, values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
    return f"  {label:<36} median {statistics.median(values):8.3f}   p90 {p90:8.3f}   " \
           f"(n={len(values)})"


def isolated_child(slot: cgroups.Slot) -> Child:
    def child(report: int) -> None:
        enter = timed_ns(slot.enter)
        non_dumpable = timed_ns(isolation.make_non_dumpable)
        os.write(report, struct.pack("q", enter) + struct.pack("q", non_dumpable))
    return child


def entering_child(slot: cgroups.Slot) -> Child:
    def child(report: int) -> None:
        os.write(report, struct.pack("q", timed_ns(slot.enter)))
    return child


def collecting_child(report: int) -> None:
    gc.collect()


def prepare_remove(caps: cgroups.MemoryCaps, iterations: int) -> list[float]:
    values = []
    for i in range(iterations):
        start = time.perf_counter_ns()
        caps.prepare(f"bench-{os.getpid()}-{i}", 64 * MiB).remove()
        values.append((time.perf_counter_ns() - start) / 1e6)
    return values


def measure(caps: cgroups.MemoryCaps, args: argparse.Namespace) -> list[str]:
    slot = caps.prepare(f"bench-{os.getpid()}", args.memory_limit)
    try:
        bare, _ = run(lambda report: None, args.iterations)
        isolated, (enter, non_dumpable) = run(isolated_child(slot), args.iterations, reports=2)
        _, (enter_idle,) = run(entering_child(slot), args.idle_iterations, args.idle_gap, 1)
        collect, _ = run(collecting_child, args.iterations)
    finally:
        slot.remove()
    return [summary("bare fork+exit+waitpid", bare),
            summary("fork+enter+non_dumpable+exit", isolated),
            summary("  enter (in child), back-to-back", enter),
            summary(f"  enter (in child), after {args.idle_gap * 1000:.0f} ms idle", enter_idle),
            summary("  non_dumpable (in child)", non_dumpable),
            summary("fork+gc.collect()+exit", collect),
            summary("prepare+remove", prepare_remove(caps, args.iterations))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--idle-iterations", type=int, default=30)
    parser.add_argument("--idle-gap", type=float, default=0.05, help="seconds")
    parser.add_argument("--ballast", type=int, default=200_000, help="dicts held by the parent")
    parser.add_argument("--memory-limit", type=int, default=64 * MiB)
    parser.add_argument("--force", choices=cgroups.KINDS, default=None)
    args = parser.parse_args(argv)
    ballast = [{"i": i, "s": str(i)} for i in range(args.ballast)]
    with cgroups.detect(force=args.force) as caps:
        print(f"{caps.describe()}\nPython {sys.version.split()[0]}, kernel {os.uname().release},"
              f" ballast {len(ballast)} dicts, times in ms")
        for frozen in (False, True):
            gc.collect()
            if frozen:
                gc.freeze()
            print(f"{'with' if frozen else 'without'} gc.freeze():")
            print("\n".join(measure(caps, args)))
            gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
