#!/usr/bin/env python
"""CPU per task of a worker, start-up cancelled out: less sensitive to a loaded machine than
a drain rate.

usage (from the project root, after ../shared/peers/setup.sh and
`/tmp/peers-venv/bin/pip install -e .`):

    BENCH_COUNTER_URL=redis://127.0.0.1:6379/12 PYTHONPATH=benchmarks:../shared/peers \
        /tmp/peers-venv/bin/python benchmarks/worker_cpu.py CONFIG [--small 400] [--large 1600]

CONFIG is what `../shared/peers/bench.py` takes (`celery-rabbitmq`,
`module:p_conveyor:rabbitmq-reuse100`, ...). For each of two sizes it queues that many no-op
tasks with the peer's own API, starts its worker, waits until the last task body has run,
stops the worker and reads the CPU time (user + system) of the whole process tree from
`wait4` (children the tree reaped included). The difference between the two sizes divided
by the difference in tasks is the worker's CPU per task; start-up and shutdown cancel out.
Under CPU contention (2 cores shared with other jobs) this decides throughput more than
any wait does. Set OLD_SRC=/path/to/other/src: to run another checkout's code in the
worker with the same interpreter (a same-run before/after).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers")


def drain(config: str, n: int) -> tuple[float, float]:
    """(wall seconds from worker start to the n-th task, CPU seconds of the worker tree)."""
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
    started = time.monotonic()
    worker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    while int(counter.get(common.K_DONE) or 0) < n:
        time.sleep(0.05)
    wall = time.monotonic() - started
    worker.send_signal(signal.SIGTERM if config.startswith("celery") else signal.SIGINT)
    _, _, usage = os.wait4(worker.pid, 0)
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--small", type=int, default=400)
    parser.add_argument("--large", type=int, default=1600)
    args = parser.parse_args()
    peers = os.environ.get("PEERS_DIR", PEERS)
    sys.path[:0] = [peers]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("OLD_SRC", "").rstrip(":"), peers,
                    os.environ.get("PYTHONPATH", "")) if p)
    (_, cpu_small), (wall, cpu_large) = drain(args.config, args.small), drain(args.config,
                                                                             args.large)
    per_task = (cpu_large - cpu_small) / (args.large - args.small) * 1000
    load = open("/proc/loadavg").read().split()[0]
    print(f"{args.config}: {per_task:.2f} ms CPU per task (worker tree); {args.large} tasks "
          f"drained in {wall:.1f} s from start; load average {load}")


if __name__ == "__main__":
    main()
