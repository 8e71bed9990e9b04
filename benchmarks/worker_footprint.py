#!/usr/bin/env python3
"""Idle worker footprint: PSS of every process of a `conveyor worker` tree, and import cost.

    .venv/bin/python benchmarks/worker_footprint.py --slots 2
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python benchmarks/worker_footprint.py

(the second measures another checkout's code with the same interpreter, for a same-run ratio)

Starts a worker on a private embedded SQLite queue, waits until its process tree
(supervisor, zygote and its sentinel, one lane per slot, warm runners) stops growing, then
prints each process's PSS and the total. PSS splits shared pages between the processes
sharing them, so the total is what the tree costs the machine; its anonymous part is what
this code decides, the same whatever else runs (the file part moves by ~3 MiB with the
number of other Python processes sharing the interpreter's library pages). Also prints `import
conveyor`'s time and the modules it loads, since every worker process imports the package
first.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tree(root: int) -> list[int]:
    """`root` and its descendants, parents first."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        for thread in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(c) for c in (thread / "children").read_text().split()]
            except OSError:
                continue
    return found


def memory_kib(pid: int, field: str) -> int:
    """One field of /proc/PID/smaps_rollup (Pss, Rss) in KiB."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", rollup, re.M)
    return int(match.group(1)) if match else 0


def settled_tree(root: int, expected: int, timeout: float = 30.0) -> list[int]:
    """Wait until the tree has `expected` processes (the lanes' warm runners are forked)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = tree(root)
        if len(pids) >= expected:
            return pids
        time.sleep(0.05)
    raise SystemExit(f"the worker's tree has {len(tree(root))} processes, expected {expected}")


def describe(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:70]


def import_cost() -> None:
    probe = ("import sys, time; t = time.perf_counter(); import conveyor; "
             "print(f'{(time.perf_counter() - t) * 1000:.1f} ms', len(sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.split()
    bare = subprocess.run([sys.executable, "-c", "import sys; print(len(sys.modules))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    print(f"import conveyor: {out[0]} {out[1]}, {int(out[2]) - int(bare)} modules beyond "
          "the interpreter's own")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--warm", type=int, default=2, help="the pool's warm runners per lane")
    args = parser.parse_args()
    import_cost()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "CONVEYOR_HOME": home}
        worker = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", "-c", str(args.slots), "-Q",
             "footprint"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # supervisor, zygote, its sentinel, and per slot a lane and its warm runners
            pids = settled_tree(worker.pid, 3 + args.slots * (1 + args.warm))
            time.sleep(1.0)   # let start-up garbage settle; the tree is complete already
            total = anonymous = 0
            for pid in tree(worker.pid):
                kib = memory_kib(pid, "Pss")
                total += kib
                anonymous += memory_kib(pid, "Pss_Anon")
                print(f"  {pid:>7} PSS {kib / 1024:5.1f} MiB  RSS "
                      f"{memory_kib(pid, 'Rss') / 1024:5.1f} MiB  {describe(pid)}")
            print(f"{len(pids)} processes, {total / 1024:.1f} MiB PSS in all, "
                  f"{anonymous / 1024:.1f} of it anonymous (the rest, the interpreter's and "
                  "libraries' pages, is shared with the machine's other Python processes: "
                  "fewer of them, a larger share)")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
