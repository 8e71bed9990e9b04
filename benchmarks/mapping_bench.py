#!/usr/bin/env python
"""Dynamic task mapping benchmark: a 1,000-element map, from the upstream's success to the
last instance's start.

usage: python benchmarks/mapping_bench.py [--elements 1000] [--concurrency 4] [--rounds 3]
           [--state sqlite|postgres] [--worker-args=--max-tasks-per-child=100] [--json]

* engine: the scheduler's own cost, no broker: an engine on the state store with a recording
  executor applies `extract`'s success (a list of N elements) and creates, claims, hands to
  the executor (one submit) and records the publish of the N instances. Milliseconds.
* end to end: a real `conveyor worker` (`--concurrency` slots) and the scheduler daemon on a
  thread of this process, SQLite broker and (default) SQLite state store; each round is one
  run of extract -> process.expand(item=extract) -> total. From the state store: extract's
  end -> first and last instance started (map-to-last-start) -> last instance ended -> total
  started. (Instances' queued_at and published_at are the `now` of the batch that made them,
  so the creation itself is what the engine figure measures.) Beside it, the worker alone:
  the same N no-op tasks published at once straight to it, publish to N-th success: the
  bound a scheduler that cost nothing would reach.

Figures are printed; nothing is asserted (speed lives here, not in the tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from conveyor import broker as brokers
from conveyor.client import Client
from conveyor.events import Event
from conveyor.message import Message
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build, poke
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from tests.support import RecordingExecutor, event, spawn, stop, wait_for  # noqa: E402

POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
APP = '''\
from conveyor import task


@task(name="mapbench.extract")
def extract(n):
    return list(range(n))


@task(name="mapbench.process")
def process(item):
    return item


@task(name="mapbench.total")
def total(values):
    return len(values)


@task(name="mapbench.noop")
def noop(i):
    return i
'''


def mapped_dag(n: int, queue: str, max_map_length: int) -> DAG:
    dag = DAG("mapbench", queue=queue, retries=0)
    numbers = dag.task("mapbench.extract", n, id="extract")
    process = dag.task("mapbench.process", id="process",
                       max_map_length=max_map_length).expand(item=numbers)
    dag.task("mapbench.total", id="total", args=[process])
    return dag


def bench_engine(n: int, state_url: str) -> dict[str, float]:
    """The scheduler alone: extract's success applied, N instances created and submitted."""
    store = from_url(state_url)
    executor = RecordingExecutor()
    dag = mapped_dag(n, "unused", n)
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    try:
        create_run(store, dag, time.time(), executors=["queue"])
        engine.tick(time.time())
        work = executor.pop("extract")
        started = time.perf_counter()
        engine.handle(event(work, "succeeded", time.time(), result=list(range(n))),
                      time.time())
        spent = time.perf_counter() - started
        submitted = len(executor.sent)
    finally:
        store.close()
    return {"instances": submitted, "apply_create_submit_ms": spent * 1000}


def state_rows(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    rows = store.rows("run_tis", run_id=run_id)
    return {"extract": [r for r in rows if r["task_id"] == "extract"],
            "instances": [r for r in rows if r["map_task"] == "process"],
            "total": [r for r in rows if r["task_id"] == "total"]}


def run_state(store: Store, run_id: str) -> str:
    run = store.one("run", run_id=run_id)
    return "" if run is None else str(run["state"])


def one_round(config: SchedulerConfig, store: Store, dag: DAG, n: int) -> dict[str, float]:
    run_id = create_run(store, dag, time.time(), executors=["queue"])
    assert run_id is not None
    poke(config, run_id)
    wait_for(lambda: run_state(store, run_id) in ("success", "failed"),
             timeout=600, what="the mapped run to end")
    found = state_rows(store, run_id)
    assert run_state(store, run_id) == "success", found["total"]
    assert len(found["instances"]) == n
    ended = found["extract"][0]["ended_at"]
    inst = found["instances"]
    starts = sorted(r["started_at"] for r in inst)
    return {"first_start_ms": (starts[0] - ended) * 1000,
            "last_start_ms": (starts[-1] - ended) * 1000,
            "last_end_ms": (max(r["ended_at"] for r in inst) - ended) * 1000,
            "total_start_ms": (found["total"][0]["started_at"] - ended) * 1000}


def straight(broker_url: str, queue: str, n: int, replies: str) -> float:
    """N no-op tasks published at once straight to the worker: milliseconds from the publish
    to the N-th success reply, what the map's instances would take with a free scheduler."""
    broker = brokers.from_url(broker_url)
    client = Client(broker)
    try:
        started = time.time()
        client.broker.publish_many([client.publication(Message(
            queue=queue, task="mapbench.noop", args=(i,), reply_to=replies, max_retries=0))
            for i in range(n)])
        done = 0
        for delivery in broker.consume([replies], prefetch=64, timeout=60):
            assert delivery is not None, "the worker stopped answering"
            broker.ack(delivery)
            done += Event.decode(delivery.body).kind == "succeeded"
            if done == n:
                break
        return (time.time() - started) * 1000
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--elements", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--state", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--worker-args", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n, tag = args.elements, uuid.uuid4().hex[:8]
    report: dict[str, Any] = {"elements": n, "concurrency": args.concurrency}
    with tempfile.TemporaryDirectory() as tmp:
        state_url = (f"sqlite:///{tmp}/state.db" if args.state == "sqlite"
                     else f"{POSTGRES}?schema=mbench{tag}")
        try:
            report["engine"] = [bench_engine(n, state_url.replace("state.db", f"e{i}.db")
                                             if args.state == "sqlite" else state_url)
                                for i in range(args.rounds)]
            report["end_to_end"], report["worker_alone_ms"] = end_to_end(
                args, Path(tmp), state_url, tag)
        finally:
            if args.state == "postgres":
                with psycopg.connect(POSTGRES, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(f"mbench{tag}")))
    print(json.dumps(report, indent=2) if args.json else summary(report))


def end_to_end(args: argparse.Namespace, tmp: Path, state_url: str, tag: str
               ) -> tuple[list[dict[str, float]], list[float]]:
    """Rounds of the mapped run, each followed by the same N tasks straight to the worker."""
    n = args.elements
    (tmp / "mapbench_app.py").write_text(APP)
    broker_url = f"sqlite:///{tmp}/broker.db"
    queue, events, control = f"work-{tag}", f"events-{tag}", f"control-{tag}"
    dag = mapped_dag(n, queue, n)
    config = SchedulerConfig.from_env(
        {"CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0"}, broker_url=broker_url, state_url=state_url,
        events_queue=events, control_queue=control)
    daemon = build(config, {dag.dag_id: dag})
    scheduler = threading.Thread(target=daemon.run, name="scheduler")
    worker = spawn("worker", "--queues", queue, "--concurrency", str(args.concurrency),
                   "--broker", broker_url, "--app", "mapbench_app", "--log-level", "ERROR",
                   *args.worker_args.split(), env={"PYTHONPATH": str(tmp)})
    store = from_url(state_url)
    try:
        with brokers.from_url(broker_url) as probe:    # the worker consumes: it is ready
            probe.publish(queue, b"warm-up: not a message")
            wait_for(lambda: not probe.depth(queue).ready, timeout=60, what="the worker")
        scheduler.start()
        rounds, alone = [], []
        for _ in range(args.rounds):
            rounds.append(one_round(config, store, dag, n))
            alone.append(straight(broker_url, queue, n, f"straight-{tag}"))
        return rounds, alone
    finally:
        daemon.stop()
        scheduler.join(30)
        daemon.close()
        store.close()
        stop(worker)


def summary(report: dict[str, Any]) -> str:
    lines = [f"{report['elements']}-element map, worker with {report['concurrency']} slots"]
    for e in report["engine"]:
        lines.append(f"  engine alone: success applied, {e['instances']} instances created "
                     f"and submitted in {e['apply_create_submit_ms']:.0f} ms")
    for r, alone in zip(report["end_to_end"], report["worker_alone_ms"], strict=True):
        lines.append(
            f"  end to end, from extract's end: first instance start "
            f"{r['first_start_ms']:.0f} ms, "
            f"last start {r['last_start_ms']:.0f} ms (map-to-last-start), last end "
            f"{r['last_end_ms']:.0f} ms, reduce start {r['total_start_ms']:.0f} ms; the "
            f"worker alone runs the same {report['elements']} tasks in {alone:.0f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
