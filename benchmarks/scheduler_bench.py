#!/usr/bin/env python
"""Scheduler benchmark: hop latency, fan-out throughput, idle cost, store transitions/s.

usage: python benchmarks/scheduler_bench.py [--brokers sqlite,redis,postgres,rabbitmq]
           [--hops 200] [--fanout 100] [--idle 10] [--tasks 1000] [--json]

* hop: a chain DAG of `--hops` + 1 no-op tasks on a real `conveyor worker` (2 slots); for each
  edge, parent's success (the worker's `succeeded` event) -> child's start (its `started`
  event). Of that: the event reaching the scheduler (success -> child queued), and the
  scheduler's own handling of it (apply the transition, publish the children). p50 and p99.
* fan-out: `--fanout` independent no-op tasks, one worker with 2 slots: tasks/s from the
  first dispatch to the last success.
* idle: `conveyor scheduler` with the example DAGs and nothing to do: CPU share over `--idle`
  seconds (utime + stime from /proc) and resident memory.
* transitions: the engine alone (a recording executor, no broker) on SQLite and Postgres: a
  run of `--tasks` independent tasks, each queued -> running -> success; transitions/s.

The state store is the embedded SQLite file unless stated. Queues are unique per run and
purged afterwards; Postgres schemas are dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
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
from conveyor.scheduler import DAG, examples
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import from_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from tests.conftest import delete_redis_prefix  # noqa: E402
from tests.support import RecordingExecutor, event, run_to_end, spawn, stop  # noqa: E402

POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
URLS = {
    "sqlite": "sqlite:///{tmp}/broker.db",
    "redis": "redis://127.0.0.1:6379/0?prefix=sbench{tag}",
    "postgres": POSTGRES + "?schema=sbench{tag}",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
}
NOOP = "revenue.extract_orders"   # a registered no-op (no ledger): returns a number
APP = "conveyor.scheduler.examples.revenue"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def drop_schema(name: str) -> None:
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def timed_successes(engine: Engine, spent: list[float]) -> None:
    """Record how long the engine takes over each success event (apply + publish children)."""
    handle = engine.handle

    def timed(event_: Event, now: float) -> None:
        started = time.perf_counter()
        handle(event_, now)
        if event_.kind == "succeeded":
            spent.append((time.perf_counter() - started) * 1000)

    engine.handle = timed  # type: ignore[method-assign]


def run_on_workers(dag: DAG, broker: str, tmp: Path, tag: str, slots: int = 2,
                   spent: list[float] | None = None) -> list[dict]:
    """Run one run of `dag` (its tasks on queue work-TAG) with the daemon in-process and one
    real worker; its task instances."""
    url = URLS[broker].format(tmp=tmp, tag=tag)
    queue, events = f"work-{tag}", f"events-{tag}"
    config = SchedulerConfig.from_env({}, broker_url=url, state_url=f"sqlite:///{tmp}/s.db",
                                      events_queue=events, control_queue=f"control-{tag}")
    daemon = build(config, {dag.dag_id: dag})
    timed_successes(daemon.engine, spent if spent is not None else [])
    worker = spawn("worker", "--queues", queue, "--concurrency", str(slots), "--broker", url,
                   "--app", APP, "--log-level", "ERROR")
    try:
        with brokers.from_url(url) as probe:     # the worker is consuming: warm it up first
            probe.publish(queue, b"warm-up: not a message")
            while probe.depth(queue).ready:
                time.sleep(0.05)
        run_id = create_run(daemon.engine.store, dag, time.time(), executors=["queue"])
        run_to_end(daemon, timeout=300)
        return daemon.engine.store.rows("run_tis", run_id=run_id)
    finally:
        daemon.close()
        stop(worker)
        with brokers.from_url(url) as broker_:
            for q in (queue, events, f"control-{tag}"):
                broker_.purge(q)
        if broker == "postgres":
            drop_schema(f"sbench{tag}")
        if broker == "redis":
            delete_redis_prefix(f"sbench{tag}")


def bench_hops(broker: str, hops: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    dag = DAG("chain", queue=f"work-{tag}", retries=0)
    previous = dag.task(NOOP, id="t0")
    for i in range(1, hops + 1):
        node = dag.task(NOOP, id=f"t{i}")
        previous >> node
        previous = node
    with tempfile.TemporaryDirectory() as tmp:
        spent: list[float] = []
        tasks = {t["task_id"]: t for t in run_on_workers(dag, broker, Path(tmp), tag,
                                                          spent=spent)}
    hop, sched = [], []
    for i in range(1, hops + 1):
        parent, child = tasks[f"t{i - 1}"], tasks[f"t{i}"]
        hop.append((child["started_at"] - parent["ended_at"]) * 1000)
        sched.append((child["queued_at"] - parent["ended_at"]) * 1000)
    return {"broker": broker, "hops": hops, "p50_ms": percentile(hop, 0.5),
            "p99_ms": percentile(hop, 0.99), "to_scheduler_p50_ms": percentile(sched, 0.5),
            "to_scheduler_p99_ms": percentile(sched, 0.99),
            "handling_p50_ms": percentile(spent, 0.5), "handling_p99_ms": percentile(spent, 0.99)}


def bench_fanout(broker: str, n: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    dag = DAG("fan", queue=f"work-{tag}", retries=0)
    for i in range(n):
        dag.task(NOOP, id=f"t{i}")
    with tempfile.TemporaryDirectory() as tmp:
        tasks = run_on_workers(dag, broker, Path(tmp), tag)
    span = max(t["ended_at"] for t in tasks) - min(t["queued_at"] for t in tasks)
    return {"broker": broker, "tasks": n, "slots": 2, "tasks_per_s": n / span,
            "worker_alone_tasks_per_s": bench_worker_alone(broker, n)}


def bench_worker_alone(broker: str, n: int) -> float:
    """Tasks/s of the same no-op tasks enqueued straight to a 2-slot worker (no scheduler):
    what the fan-out would reach if the scheduler cost nothing."""
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory() as tmp:
        url = URLS[broker].format(tmp=tmp, tag=tag)
        queue, replies = f"work-{tag}", f"replies-{tag}"
        worker = spawn("worker", "--queues", queue, "--concurrency", "2", "--broker", url,
                       "--app", APP, "--log-level", "ERROR")
        client = Client(brokers.from_url(url))
        try:
            time.sleep(2)                          # the worker is up and its runners warm
            started = time.time()
            for _ in range(n):
                client.enqueue(Message(queue=queue, task=NOOP, reply_to=replies,
                                       max_retries=0))
            last = 0.0
            done = 0
            for delivery in client.broker.consume([replies], prefetch=64, timeout=30):
                assert delivery is not None, "the worker stopped answering"
                reply = Event.decode(delivery.body)
                client.broker.ack(delivery)
                if reply.kind == "succeeded":
                    done, last = done + 1, max(last, reply.at)
                    if done == n:
                        break
            return n / (last - started)
        finally:
            stop(worker)
            for q in (queue, replies):
                client.broker.purge(q)
            client.close()
            if broker == "postgres":
                drop_schema(f"sbench{tag}")
            if broker == "redis":
                delete_redis_prefix(f"sbench{tag}")


def bench_idle(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp}/b.db",
               "CONVEYOR_STATE_URL": f"sqlite:///{tmp}/s.db",
               "CONVEYOR_DAGS_FOLDER": str(Path(examples.__file__).parent / "dags")}
        proc = spawn("scheduler", "--log-level", "WARNING", env=env)
        try:
            time.sleep(3)                      # started, migrated, DAGs loaded
            before = cpu_seconds(proc.pid)
            time.sleep(seconds)
            used = cpu_seconds(proc.pid) - before
            rss = rss_mib(proc.pid)
        finally:
            stop(proc)
    return {"idle_seconds": seconds, "cpu_percent": 100 * used / seconds, "rss_mib": rss}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_transitions(store_url: str, label: str, n: int) -> dict[str, Any]:
    dag = DAG("wide")
    for i in range(n):
        dag.command(f"t{i}", ["true"], retries=0)
    store = from_url(store_url)
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"wide": dag})
    try:
        create_run(store, dag, time.time(), executors=["queue"])
        started = time.perf_counter()
        engine.tick(time.time())                       # n x pending -> queued
        for work in executor.sent:
            now = time.time()
            engine.handle(event(work, "started", now), now)      # queued -> running
            engine.handle(event(work, "succeeded", now), now)    # running -> success
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    return {"store": label, "tasks": n, "transitions": 3 * n,
            "transitions_per_s": 3 * n / elapsed}


def reachable(broker: str) -> bool:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            brokers.from_url(URLS[broker].format(tmp=tmp, tag="probe")).close()
        return True
    except Exception as exc:  # report and skip a transport that is not there
        print(f"skipping {broker}: {exc!r}", file=sys.stderr)
        return False
    finally:
        if broker == "postgres":
            drop_schema("sbenchprobe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default="sqlite,redis,postgres,rabbitmq")
    parser.add_argument("--hops", type=int, default=200)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = [b for b in args.brokers.split(",") if b and reachable(b)]
    results: dict[str, Any] = {
        "hop": [bench_hops(b, args.hops) for b in chosen],
        "fanout": [bench_fanout(b, args.fanout) for b in chosen],
        "idle": bench_idle(args.idle),
        "transitions": [bench_transitions(f"sqlite:///{tempfile.mkdtemp()}/t.db", "sqlite",
                                          args.tasks)],
    }
    schema = "sbench" + uuid.uuid4().hex[:8]
    try:
        results["transitions"].append(bench_transitions(f"{POSTGRES}?schema={schema}",
                                                        "postgres", args.tasks))
    finally:
        drop_schema(schema)
    print(json.dumps(results, indent=2) if args.json else report(results))
    return 0


def report(results: dict[str, Any]) -> str:
    lines = ["hop latency, parent success -> child start (ms); of which: the success event "
             "reaching the scheduler, and the scheduler handling it (apply + publish children)",
             f"  {'broker':10} {'p50':>7} {'p99':>7} {'reach p50':>10} {'reach p99':>10} "
             f"{'handle p50':>11} {'handle p99':>11}"]
    lines += [f"  {h['broker']:10} {h['p50_ms']:7.2f} {h['p99_ms']:7.2f} "
              f"{h['to_scheduler_p50_ms']:10.2f} {h['to_scheduler_p99_ms']:10.2f} "
              f"{h['handling_p50_ms']:11.2f} {h['handling_p99_ms']:11.2f}"
              for h in results["hop"]]
    lines += ["fan-out, 2 worker slots"]
    lines += [f"  {f['broker']:10} {f['tasks']} tasks: {f['tasks_per_s']:.1f} tasks/s "
              f"(the same tasks enqueued straight to the worker: "
              f"{f['worker_alone_tasks_per_s']:.1f} tasks/s)" for f in results["fanout"]]
    idle = results["idle"]
    lines += [f"idle scheduler: {idle['cpu_percent']:.2f}% of a core over "
              f"{idle['idle_seconds']:g} s, {idle['rss_mib']:.1f} MiB resident"]
    lines += ["engine transitions (no broker)"]
    lines += [f"  {t['store']:10} {t['transitions_per_s']:.0f} transitions/s "
              f"({t['transitions']} transitions)" for t in results["transitions"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
