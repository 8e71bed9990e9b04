"""What task results cost: per backend, storing a result vs fire-and-forget, and how soon
`handle.result()` returns after the task ends.

    .venv/bin/python benchmarks/results_bench.py [--tasks 300] [sqlite redis postgres]

For each broker (with its default result store: SQLite `results.db` beside the broker file,
Redis keys beside the queues, the Postgres broker's database) one real `conveyor worker -c 2`
runs, and the script prints:

* `put`: one `ResultStore.put` (durable write + notify), in microseconds;
* `throughput ratio`: wall time to drain N no-op tasks that ask for their result over N that
  do not (rounds alternate, same worker, same run): the end-to-end cost of the feature;
* `latency p50/p99`: from the task's return (a timestamp it returns) to the caller's
  `handle.result()` returning it: report, store, notify and wake-up.

Ratios, not absolute times: the machine is shared.
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
from pathlib import Path

from conveyor import results
from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.tasks import task

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "results-bench"


@task(name="results_bench.noop", queue=QUEUE)
def noop() -> None:
    return None


@task(name="results_bench.stamp", queue=QUEUE)
def stamp() -> float:
    return time.time()


def urls(tmp: str, name: str) -> dict[str, str]:
    return {"sqlite": f"sqlite:///{tmp}/broker.db",
            "redis": f"redis://127.0.0.1:6379/0?prefix={name}",
            "postgres": f"postgresql://postgres@127.0.0.1:5432/postgres?schema={name}"}


def start_worker(url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CONVEYOR_BROKER_URL": url,
           "PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT / 'src'}"}
    return subprocess.Popen([sys.executable, "-m", "conveyor.cli", "worker", "-A",
                             "results_bench", "-Q", QUEUE, "-c", "2", "--log-level=WARNING",
                             "--max-tasks-per-child=1"], env=env, cwd=ROOT)


def drain(client: Client, n: int, keep: bool) -> float:
    """Seconds to publish `n` no-ops and see the worker finish them all."""
    started = time.perf_counter()
    handles = [client.enqueue(noop.message(), keep_result=keep) for _ in range(n)]
    if keep:
        handles[-1].result(timeout=300)
    while client.broker.depth(QUEUE).active:
        time.sleep(0.005)
    return time.perf_counter() - started


def put_micros(store: results.ResultStore, n: int = 300) -> float:
    record = results.ResultRecord("succeeded", value={"rows": 1200, "path": "/x/orders.csv"})
    started = time.perf_counter()
    for _ in range(n):
        store.put(uuid.uuid4().hex, record, 60)
    return (time.perf_counter() - started) / n * 1e6


def latencies(client: Client, n: int) -> list[float]:
    seen = []
    for _ in range(n):
        handle = client.enqueue(stamp.message(), keep_result=True)
        value = handle.result(timeout=60)
        seen.append((time.time() - value) * 1000)
    return sorted(seen)


def bench(backend: str, url: str, tasks: int, rounds: int, lat_n: int) -> None:
    client = Client(from_url(url), settings=Settings(broker_url=url))
    worker = start_worker(url)
    try:
        drain(client, 20, True)   # warm: worker up, store created
        plain, kept = [], []
        for _ in range(rounds):
            plain.append(drain(client, tasks, False))
            kept.append(drain(client, tasks, True))
        lat = latencies(client, lat_n)
        put = put_micros(client.results())
    finally:
        worker.terminate()
        worker.wait(60)
        client.broker.purge(QUEUE)
        client.close()
    ratio = statistics.median(k / p for k, p in zip(kept, plain, strict=True))
    print(f"{backend:9} put {put:7.0f} us | {tasks} tasks: fire-and-forget "
          f"{statistics.median(plain):6.2f}s, with results {statistics.median(kept):6.2f}s, "
          f"ratio {ratio:.3f} | handle.result() after the task ends: "
          f"p50 {lat[len(lat) // 2]:.1f} ms, p99 {lat[int(len(lat) * 0.99) - 1]:.1f} ms",
          flush=True)


def cleanup(backend: str, name: str) -> None:
    if backend == "redis":
        import redis
        r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        keys = list(r.scan_iter(f"{name}:*"))
        if keys:
            r.delete(*keys)
    elif backend == "postgres":
        import psycopg
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("backends", nargs="*", default=["sqlite", "redis", "postgres"])
    p.add_argument("--tasks", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency", type=int, default=100)
    args = p.parse_args()
    for backend in args.backends:
        name = f"resbench{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory() as tmp:
            try:
                bench(backend, urls(tmp, name)[backend], args.tasks, args.rounds, args.latency)
            finally:
                cleanup(backend, name)


if __name__ == "__main__":
    main()
