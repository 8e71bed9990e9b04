#!/usr/bin/env python
"""The ceiling of ANY fresh-process-per-task design on this machine, with no broker at all.

usage (the peers' venv, which has redis-py; PYTHONPATH is not needed):

    BENCH_COUNTER_URL=redis://127.0.0.1:6379/13 /tmp/peers-venv/bin/python \
        benchmarks/fresh_process_ceiling.py [--n 2000] [--slots 2] [--body incr ...]

A bare loop forks one child per task, `--slots` at a time, reaps each and forks the next: no
broker, no supervisor, no cgroup, no isolation step. The child runs a task body and exits.
Whatever a worker that gives every task a fresh process does, it cannot drain faster than
this loop, nor spend less CPU per task than its children do here; the gap between the two
is the worker's own overhead. Bodies (each run in its own sitting, in the order given):

  none          the child exits at once: fork + exit + reap, parent a bare interpreter
  none-redis    the same, the parent having imported the peers' module (redis-py): what
                a bigger fork source costs (page tables copied, more pages faulted)
  raw           INCR over a raw socket (connect, one round trip, close)
  incr          the peers' no-op, `common.mark_done()`: a NEW redis-py client and INCR, as
                every fresh process must (redis-py 8: HELLO, CLIENT MAINT_NOTIFICATIONS,
                CLIENT SETINFO x2, SELECT, INCRBY), parent as cold as a plain import
  incr-memo     the same, the parent warmed as Conveyor's zygote warms (worker/warmup.py:
                name service, lazy stdlib imports, `importlib.metadata.version` memoised)

Printed per body: tasks/s (wall), CPU per child (user + system, from the reaped children's
rusage) and the parent's CPU per task, with the load average before and after.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time
from collections.abc import Callable

BODIES = ("none", "none-redis", "raw", "incr", "incr-memo")


def peers_dir() -> str:
    """../shared/peers beside the checkout (the main one, or a worktree's main's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for up in ("..", os.path.join("..", ".."), os.path.join("..", "..", "..")):
        candidate = os.path.normpath(os.path.join(here, up, "shared", "peers"))
        if os.path.isdir(candidate):
            return candidate
    raise SystemExit("cannot find shared/peers above this checkout: set PEERS_DIR")


def _raw_incr() -> None:
    with socket.create_connection(("127.0.0.1", 6379)) as s:
        s.sendall(b"*2\r\n$4\r\nINCR\r\n$13\r\nceiling:raw:n\r\n")
        s.recv(100)


def body(name: str) -> Callable[[], None]:
    """The child's task; imports and warms in the parent what the body's kind would."""
    if name == "none":
        return lambda: None
    if name == "none-redis":
        import common  # type: ignore[import-not-found]  # noqa: F401 - its image is the point
        return lambda: None
    if name == "raw":
        socket.getaddrinfo("127.0.0.1", 6379)
        return _raw_incr
    import common  # type: ignore[import-not-found]  # the peers' instrumentation
    if name == "incr-memo":
        from conveyor.worker import warmup
        warmup.warm()
    counter = common.client()
    counter.ping()
    counter.delete(common.K_DONE)
    common._r = None  # the parent's client is not inherited: every child makes its own
    return common.mark_done


def drain(task: Callable[[], None], n: int, slots: int) -> tuple[float, float, float]:
    """(tasks/s, child CPU ms per task, parent CPU ms per task) of n forks, `slots` at once."""
    gc.collect()
    gc.freeze()  # as a zygote does: the children's collections never touch these pages
    before = os.times()
    start = time.perf_counter()
    running = started = done = 0
    while done < n:
        while running < slots and started < n:
            if os.fork() == 0:
                try:
                    task()
                finally:
                    os._exit(0)
            running += 1
            started += 1
        os.wait()
        running -= 1
        done += 1
    wall = time.perf_counter() - start
    after = os.times()
    children = (after.children_user + after.children_system
                - before.children_user - before.children_system)
    parent = after.user + after.system - before.user - before.system
    return n / wall, children / n * 1e3, parent / n * 1e3


def run_body(name: str, n: int, slots: int) -> str:
    """One body in a fresh interpreter (so one body's warm-up never helps the next)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        rate, child, parent = drain(body(name), n, slots)
        os.write(write, f"{rate} {child} {parent}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    rate, child, parent = (float(x) for x in out.split())
    return f"{name:<11}{rate:>10.0f}{child:>15.2f}{parent:>16.2f}"


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--body", action="append", choices=BODIES)
    args = parser.parse_args()
    sys.path.insert(0, os.environ.get("PEERS_DIR") or peers_dir())
    os.environ.setdefault("BENCH_COUNTER_URL", "redis://127.0.0.1:6379/13")
    print(f"fresh-process ceiling: {args.n} tasks, {args.slots} at a time; load {load()}")
    print(f"{'body':<11}{'tasks/s':>10}{'child CPU ms':>15}{'parent CPU ms':>16}")
    for name in args.body or BODIES:
        print(run_body(name, args.n, args.slots), flush=True)
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
