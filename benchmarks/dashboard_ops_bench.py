#!/usr/bin/env python
"""What the dashboard's operational data costs: the scheduler's queue sampling, idle, and
one sample per broker.

usage: python benchmarks/dashboard_ops_bench.py [--idle 60] [--rounds 2] [--queues 5]
           [--brokers sqlite,redis,postgres,rabbitmq]

* idle: `conveyor scheduler` with the example DAGs and nothing to do, sampling queue depth
  every 15 s (the default) and not at all (`--queue-sample-interval 0`), in interleaved
  rounds of `--idle` seconds each: CPU share (utime + stime from /proc) of each.
* one sample: `sample()` (read `--queues` depths, write them in one transaction) on each
  broker, into an embedded SQLite state store: median and worst of 20, in ms.
* the pages' readers: `queue_overview` (depth now for the known queues, the last hour's
  samples and per-minute outcomes) over a store holding an hour of samples of `--queues`
  queues at 15 s, SQLite broker: median of 20, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from conveyor import broker as brokers
from conveyor.readers.queue_history import queue_overview
from conveyor.scheduler import examples
from conveyor.scheduler.sampler import sample
from conveyor.state.store import from_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from benchmarks.scheduler_bench import URLS, cpu_seconds, drop_schema, reachable  # noqa: E402
from tests.conftest import delete_redis_prefix  # noqa: E402
from tests.support import spawn, stop  # noqa: E402


def idle_cpu(seconds: float, interval: str) -> float:
    """CPU % of an idle scheduler sampling every `interval` seconds ("0": not sampling)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp}/b.db",
               "CONVEYOR_STATE_URL": f"sqlite:///{tmp}/s.db",
               "CONVEYOR_DAGS_FOLDER": str(Path(examples.__file__).parent / "dags"),
               "CONVEYOR_QUEUE_SAMPLE_INTERVAL": interval}
        proc = spawn("scheduler", "--log-level", "WARNING", env=env)
        try:
            time.sleep(3)                      # started, migrated, DAGs loaded
            before = cpu_seconds(proc.pid)
            time.sleep(seconds)
            used = cpu_seconds(proc.pid) - before
        finally:
            stop(proc)
    return 100 * used / seconds


def one_sample(broker_name: str, queues: int) -> tuple[float, float]:
    """(median, worst) ms of one sample of `queues` queues on `broker_name`."""
    tag = f"dob{int(time.time())}"
    with tempfile.TemporaryDirectory() as tmp:
        store = from_url(f"sqlite:///{tmp}/s.db")
        broker = brokers.from_url(URLS[broker_name].format(tmp=tmp, tag=tag))
        names = [f"{tag}-q{i}" for i in range(queues)]
        took = []
        try:
            for i in range(20):
                started = time.perf_counter()
                sample(store, broker, names, time.time() + i * 15, 15.0)
                took.append((time.perf_counter() - started) * 1000)
        finally:
            broker.close()
            store.close()
            if broker_name == "postgres":
                drop_schema(f"sbench{tag}")
            if broker_name == "redis":
                delete_redis_prefix(f"sbench{tag}")
    return statistics.median(took), max(took)


def overview_ms(queues: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        store = from_url(f"sqlite:///{tmp}/s.db")
        broker = brokers.from_url(f"sqlite:///{tmp}/b.db")
        names = [f"q{i}" for i in range(queues)]
        now = time.time()
        for k in range(240):                   # an hour at 15 s
            sample(store, broker, names, now - 3600 + k * 15, 15.0)
        took = []
        for _ in range(20):
            started = time.perf_counter()
            queue_overview(store, broker, [], now)
            took.append((time.perf_counter() - started) * 1000)
        broker.close()
        store.close()
    return statistics.median(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queues", type=int, default=5)
    parser.add_argument("--brokers", default="sqlite,redis,postgres,rabbitmq")
    args = parser.parse_args()
    on, off = [], []
    for _ in range(args.rounds):
        on.append(idle_cpu(args.idle, "15"))
        off.append(idle_cpu(args.idle, "0"))
    print(f"idle scheduler CPU over {args.idle:g} s x {args.rounds} interleaved rounds "
          "(SQLite broker and state)")
    for label, values in (("sampling every 15 s", on), ("not sampling", off)):
        rounds = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {label:20} {statistics.mean(values):.3f} %  ({rounds})")
    print(f"one sample of {args.queues} queues into SQLite state (ms): median, worst of 20")
    for name in [b for b in args.brokers.split(",") if b and reachable(b)]:
        median, worst = one_sample(name, args.queues)
        print(f"  {name:10} {median:8.2f} {worst:8.2f}")
    print(f"queue_overview over an hour of samples of {args.queues} queues (SQLite): "
          f"{overview_ms(args.queues):.2f} ms median")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
