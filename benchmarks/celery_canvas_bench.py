#!/usr/bin/env python
"""An unchanged Celery producer's chains and chords through the intake: scheduler runs
(`--celery-canvas=runs`) beside the worker following them (`follow`), same machine, same run.

usage (from the project root):

    PYTHONPATH=benchmarks:src python benchmarks/celery_canvas_bench.py [--n 20] [--burst 50]

Celery's broker and result backend are the local Redis (keys under a prefix of this run,
deleted at the end), Conveyor's broker is Redis too, the state store SQLite in a temporary
directory; one `conveyor worker --concurrency 2` (and one `conveyor scheduler` for runs).
For each mode it prints the median and 90th percentile of `get()` after `apply_async()` for
a chain of three tasks and a chord of ten members, one canvas at a time (`--n` each), and
the wall time of `--burst` chains of three sent at once.

Measured on the 2-core development machine shared with other sessions (load average 9),
--n 20 --burst 50, one run:

| mode | chain of 3: median, p90 | chord of 10: median, p90 | 50 chains at once |
|---|---|---|---|
| follow | 101 ms, 134 ms | 479 ms, 738 ms | 5.31 s |
| runs | 212 ms, 360 ms | 607 ms, 1464 ms | 2.85 s |

A run costs one canvas a scheduler hop per step (the event to the scheduler, its
transaction, the next dispatch) and up to one 0.2 s look of the watcher before the last
result is written; many at once, the scheduler dispatches in batches and the intake's
feed no longer publishes each next step itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from conveyor.tasks import task

REDIS = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parents[1]


@task(name="bench.add")
def add(a: int, b: int) -> int:
    return a + b


@task(name="bench.tsum", max_retries=0)
def tsum(values: list[int]) -> int:
    return sum(values)


def producer(queue: str, prefix: str) -> Any:
    from celery import Celery
    app = Celery("canvas-bench", broker=REDIS, backend=REDIS)
    app.conf.update(task_default_queue=queue, task_serializer="json", accept_content=["json"],
                    result_serializer="json", result_expires=600,
                    broker_transport_options={"global_keyprefix": prefix})
    def never(*args: Any) -> None:   # runs on Conveyor, never here
        raise AssertionError("the producer does not run tasks")
    for name in ("bench.add", "bench.tsum"):
        app.task(name=name, shared=False)(never)
    return app


def start(mode: str, queue: str, prefix: str, tmp: Path) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env |= {"CONVEYOR_BROKER_URL": f"{REDIS}?prefix={prefix}conveyor",
            "CONVEYOR_STATE_URL": f"sqlite:///{tmp}/state.db", "CONVEYOR_LOG_LEVEL": "WARNING",
            "CONVEYOR_EVENTS_QUEUE": f"events-{prefix}",
            "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{prefix}",
            "CONVEYOR_DAGS_FOLDER": str(tmp / "dags"), "CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0",
            "PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT / 'src'}"}
    (tmp / "dags").mkdir(exist_ok=True)
    worker = [sys.executable, "-m", "conveyor.cli", "worker", "--queues=default",
              "--concurrency=2", "--app=celery_canvas_bench", f"--celery-queues={queue}",
              f"--celery-broker={REDIS}?global_keyprefix={prefix}",
              f"--celery-result-backend={REDIS}", f"--celery-canvas={mode}"]
    out = (tmp / f"{mode}.log").open("ab")
    procs = [subprocess.Popen(worker, env=env, stdout=out, stderr=subprocess.STDOUT)]
    if mode == "runs":
        procs.append(subprocess.Popen([sys.executable, "-m", "conveyor.cli", "scheduler"],
                                      env=env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def measure(app: Any, n: int, burst: int) -> dict[str, Any]:
    from celery import chain, chord
    a, s = app.tasks["bench.add"], app.tasks["bench.tsum"]
    chain(a.s(1, 1), a.s(1)).apply_async().get(timeout=120)   # warm: both processes up
    chains, chords = [], []
    for _ in range(n):
        began = time.perf_counter()
        chain(a.s(1, 2), a.s(10), a.s(100)).apply_async().get(timeout=60)
        chains.append(time.perf_counter() - began)
    for _ in range(n):
        began = time.perf_counter()
        chord([a.s(i, i) for i in range(10)], s.s()).apply_async().get(timeout=60)
        chords.append(time.perf_counter() - began)
    began = time.perf_counter()
    sent = [chain(a.s(i, 1), a.s(1), a.s(1)).apply_async() for i in range(burst)]
    for each in sent:
        each.get(timeout=300)
    return {"chain": chains, "chord": chords, "burst": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--burst", type=int, default=50)
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| mode | chain of 3: median, p90 | chord of 10: median, p90 | "
          f"{args.burst} chains at once |\n|---|---|---|---|")
    for mode in ("follow", "runs"):
        prefix = f"canvas-bench-{uuid.uuid4().hex[:8]}:"
        queue = "canvas-bench"
        with tempfile.TemporaryDirectory() as tmp:
            procs = start(mode, queue, prefix, Path(tmp))
            app = producer(queue, prefix)
            try:
                got = measure(app, args.n, args.burst)
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    proc.wait(30)
                app.close()
                _clean(prefix, f"sqlite:///{tmp}/state.db")
        row = [f"{statistics.median(got[k]) * 1000:.0f} ms, "
               f"{statistics.quantiles(got[k], n=10)[-1] * 1000:.0f} ms"
               for k in ("chain", "chord")]
        print(f"| {mode} | {row[0]} | {row[1]} | {got['burst']:.2f} s |")


def _clean(prefix: str, state_url: str) -> None:
    """This run's keys: Celery's queue and kombu's, Conveyor's broker's, the canvas runs'."""
    import redis

    from conveyor.celery_intake.run_results import prefix as runs_prefix
    client = redis.Redis.from_url(REDIS)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        keys += list(client.scan_iter(match=f"{runs_prefix(state_url)}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


if __name__ == "__main__":
    main()
