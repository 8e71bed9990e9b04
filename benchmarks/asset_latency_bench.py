#!/usr/bin/env python3
"""Event -> consumer run started: how long a DAG scheduled on an asset or an event waits.

    .venv/bin/python benchmarks/asset_latency_bench.py [--events 40] [--state URL]

A real `conveyor scheduler` and `conveyor worker` (the broker on the state store's database:
an SQLite file, or with `--state postgresql://...` a schema of the run's own, dropped
after). Two figures, from the state store's own timestamps (event `created_at`, run
`started_at`), p50 / p99 / max:

- outlet: a producing DAG is triggered, one at a time; its task's success records the
  asset event (in the scheduler that applies it), and the consumer's run starts;
- send: `Client.send_event` (what `conveyor events send` does: record, then poke the
  schedulers' control queue), one every 50 ms; each starts a run of the event's DAG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from conveyor import Asset, Client
from conveyor.config import Settings
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import poke
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url

DAGS = '''
from conveyor import DAG, Asset, Event, task

ORDERS = Asset("s3://bench/orders")


@task(name="assetbench.noop")
def noop():
    return {"rows": 1}


produce = DAG("bench_produce")
produce.task(noop, outlets=[ORDERS])
consume = DAG("bench_consume", schedule=ORDERS)
consume.task(noop, id="consume")
paid = DAG("bench_paid", schedule=Event("bench.paid"))
paid.task(noop, id="paid")
'''


def started(store: Store, dag_id: str) -> list[dict[str, object]]:
    return [r for r in store.rows("recent_runs", dag_id=dag_id, state="", limit=10_000)
            if r["started_at"] is not None]


def figures(name: str, waits: list[float]) -> None:
    ms = sorted(w * 1000 for w in waits)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    print(f"{name:8s} n={len(ms):3d}  p50 {statistics.median(ms):6.1f} ms  p99 {p99:6.1f} ms"
          f"  max {ms[-1]:6.1f} ms")


def wait_until(check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out: is the worker or the scheduler down?")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--state", default="", help="a postgresql:// URL (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        schema = f"ab{uuid.uuid4().hex[:8]}"
        if args.state:
            state, broker = f"{args.state}?schema={schema}", f"{args.state}?schema={schema}b"
        else:
            state, broker = f"sqlite:///{tmp}/state.db", f"sqlite:///{tmp}/broker.db"
        (tmp / "dags").mkdir()
        (tmp / "dags" / "bench.py").write_text(DAGS)
        env = {**os.environ, "CONVEYOR_BROKER_URL": broker, "CONVEYOR_STATE_URL": state,
               "CONVEYOR_DAGS_FOLDER": str(tmp / "dags"), "CONVEYOR_LOG_LEVEL": "WARNING"}
        procs = [subprocess.Popen([sys.executable, "-m", "conveyor.cli", *cmd], env=env,
                                  stdout=subprocess.DEVNULL)
                 for cmd in (["worker", "--concurrency", "2"], ["scheduler"])]
        store = from_url(state)
        try:
            run(store, env, state, broker, args.events)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
            store.close()
            if args.state:
                drop(args.state, schema)


def run(store: Store, env: dict[str, str], state: str, broker: str, n: int) -> None:
    settings = Settings(broker_url=broker, state_url=state)
    config = SchedulerConfig(settings=settings)
    producer = DAG("bench_produce")   # as the file declares it: what create_run needs
    producer.task("assetbench.noop", id="noop", outlets=[Asset("s3://bench/orders")])
    for i in range(n):
        create_run(store, producer, time.time(), executors=["queue"])
        poke(config, "")
        wait_until(lambda i=i: len(started(store, "bench_consume")) > i)
        time.sleep(0.05)
    figures("outlet", waits(store, "bench_consume"))
    client = Client.from_settings(settings)
    try:
        for i in range(n):
            client.send_event("bench.paid", {"i": i})
            time.sleep(0.05)
    finally:
        client.close()
    wait_until(lambda: len(started(store, "bench_paid")) == n)
    figures("send", waits(store, "bench_paid"))


def waits(store: Store, dag_id: str) -> list[float]:
    """Per run of `dag_id`: its start less the first event that started it (its tasks'
    spec keeps the events: what `context.triggering_asset_events` gives them)."""
    found = []
    for row in started(store, dag_id):
        spec = json.loads(store.rows("run_tis", run_id=row["run_id"])[0]["spec"])
        first = min(event["created_at"] for event in spec["asset_events"])
        found.append(float(row["started_at"]) - first)  # type: ignore[arg-type]
    return found


def drop(url: str, schema: str) -> None:
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        for name in (schema, f"{schema}b"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


if __name__ == "__main__":
    main()
