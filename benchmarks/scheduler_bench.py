#!/usr/bin/env python
"""Scheduler benchmark: hop latency, fan-out throughput, idle cost, store transitions/s.

usage: python benchmarks/scheduler_bench.py [--brokers sqlite,redis,postgres,rabbitmq]
           [--only hop,fanout,idle,transitions] [--hops 200] [--fanout 100] [--rounds 5]
           [--state sqlite|postgres] [--worker-args=--max-tasks-per-child=100]
           [--idle 10] [--tasks 1000] [--json]

* hop: a chain DAG of `--hops` + 1 no-op tasks on a real `conveyor worker` (2 slots); for each
  edge, parent's success (the worker's `succeeded` event) -> child's start (its `started`
  event). Of that: the event reaching the scheduler (success -> child queued), and the
  scheduler's own handling of it (apply the transition, publish the children). p50 and p99.
* fan-out: a run of `--fanout` independent no-op tasks on one worker with 2 slots (fresh
  runner per task unless `--worker-args` says otherwise): tasks/s from the run's creation to
  its end as the scheduler records it, `--rounds` times on one long-lived scheduler; each
  round first runs the same tasks enqueued straight to the worker, the figure the fan-out
  would reach if the scheduler cost nothing. CPU per task of the scheduler and of the worker.
* idle: `conveyor scheduler` with the example DAGs and nothing to do: CPU share over `--idle`
  seconds (utime + stime from /proc) and resident memory.
* transitions: the engine alone (a recording executor, no broker) on SQLite and Postgres: a
  run of `--tasks` independent tasks, each queued -> running -> success; transitions/s.

The state store is the embedded SQLite file unless `--state postgres` (fan-out only). Queues
are unique per run and deleted afterwards (purged, then RabbitMQ's queues deleted); Postgres
schemas are dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
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
from conveyor.scheduler.daemon import build, poke
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Row, Store, from_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from tests.conftest import delete_rabbitmq_queues, delete_redis_prefix  # noqa: E402
from tests.support import (  # noqa: E402
    RecordingExecutor,
    event,
    run_to_end,
    spawn,
    stop,
    wait_for,
)

POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
URLS = {
    "sqlite": "sqlite:///{tmp}/broker.db",
    "redis": "redis://127.0.0.1:6379/0?prefix=sbench{tag}",
    "postgres": POSTGRES + "?schema=sbench{tag}",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
}
PARTS = ("hop", "fanout", "idle", "transitions")
NOOP = "revenue.extract_orders"   # a registered no-op (no ledger): returns a number
APP = "conveyor.scheduler.examples.revenue"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def drop_schema(name: str) -> None:
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def timed_successes(engine: Engine, spent: list[float]) -> None:
    """Record how long the engine takes over each batch of events holding a success (apply
    + publish children): in a chain, a batch is a success and perhaps the next `started`."""
    handle_many = engine.handle_many

    def timed(events: Sequence[Event], now: float) -> None:
        started = time.perf_counter()
        handle_many(events, now)
        if any(e.kind == "succeeded" for e in events):
            spent.append((time.perf_counter() - started) * 1000)

    engine.handle_many = timed  # type: ignore[method-assign]


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
        cleanup(broker, tag)


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


def bench_fanout(broker: str, n: int, rounds: int, state: str = "sqlite",
                 worker_args: Sequence[str] = ()) -> dict[str, Any]:
    """`rounds` runs of a DAG of `n` independent no-op tasks on one 2-slot worker, each right
    after the same `n` tasks enqueued straight to that worker (what it does without a
    scheduler), so each round's two figures share the machine's load.

    A run is timed from its creation (`created_at`, before the scheduler knows of it) to its
    end as the scheduler records it (`ended_at`, once it applied the last success): what a
    user waiting on `dags trigger --wait` sees, minus the CLI. The scheduler is long-lived,
    as in production: one daemon, running on a thread of this process, takes every round's
    run, created and poked as `dags trigger` does. CPU per task: the scheduler's thread and
    the worker's whole process tree (/proc)."""
    tag = uuid.uuid4().hex[:8]
    dag = DAG("fan", queue=f"work-{tag}", retries=0)
    for i in range(n):
        dag.task(NOOP, id=f"t{i}")
    with tempfile.TemporaryDirectory() as tmp:
        url = URLS[broker].format(tmp=tmp, tag=tag)
        state_url = (f"sqlite:///{tmp}/s.db" if state == "sqlite"
                     else f"{POSTGRES}?schema=sstate{tag}")
        queue, events, replies = f"work-{tag}", f"events-{tag}", f"replies-{tag}"
        config = SchedulerConfig.from_env(   # no depth sampler: its thread starts once
            {"CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0"}, broker_url=url, state_url=state_url,
            events_queue=events, control_queue=f"control-{tag}")
        daemon = build(config, {dag.dag_id: dag})
        scheduler = threading.Thread(target=daemon.run, name="scheduler")
        worker = spawn("worker", "--queues", queue, "--concurrency", "2", "--broker", url,
                       "--app", APP, "--log-level", "ERROR", *worker_args)
        client = Client(brokers.from_url(url))
        trigger = from_url(state_url)
        try:
            warm_up(client.broker, queue)
            scheduler.start()
            found = [(straight(client, queue, replies, n, worker.pid),
                      one_run(config, trigger, dag, scheduler, worker.pid))
                     for _ in range(rounds)]
        finally:
            daemon.stop()
            scheduler.join(30)
            daemon.close()
            trigger.close()
            stop(worker)
            for q in (queue, events, replies, f"control-{tag}"):
                client.broker.purge(q)
            client.close()
            cleanup(broker, tag)
            if state != "sqlite":
                drop_schema(f"sstate{tag}")
    return {"broker": broker, "state": state, "worker_args": list(worker_args), "tasks": n,
            "slots": 2, "rounds": [{"alone": a, "fanout": f} for a, f in found]}


def warm_up(broker: brokers.Broker, queue: str) -> None:
    """Wait until the worker consumes (it dead-letters this body): its runners are ready."""
    broker.publish(queue, b"warm-up: not a message")
    while broker.depth(queue).ready:
        time.sleep(0.05)


def straight(client: Client, queue: str, replies: str, n: int, worker: int) -> dict[str, float]:
    """`n` no-op tasks published at once straight to the worker: tasks/s from the publish to
    the n-th success reply read here, and the worker tree's CPU per task."""
    cpu = tree_cpu_seconds(worker)
    started = time.time()
    client.broker.publish_many([client.publication(Message(queue=queue, task=NOOP,
                                                           reply_to=replies, max_retries=0))
                                for _ in range(n)])
    done = 0
    for delivery in client.broker.consume([replies], prefetch=64, timeout=30):
        assert delivery is not None, "the worker stopped answering"
        client.broker.ack(delivery)
        done += Event.decode(delivery.body).kind == "succeeded"
        if done == n:
            break
    ended = time.time()
    return {"tasks_per_s": n / (ended - started),
            "worker_cpu_ms_per_task": 1000 * (tree_cpu_seconds(worker) - cpu) / n}


def one_run(config: SchedulerConfig, store: Store, dag: DAG, scheduler: threading.Thread,
            worker: int) -> dict[str, float]:
    """One run of `dag`, created and poked as `dags trigger` does, run to its end by the
    scheduler: tasks/s from its creation to its end, and CPU per task of the scheduler's
    thread and of the worker tree."""
    assert scheduler.ident is not None
    clock = time.pthread_getcpuclockid(scheduler.ident)
    cpu, own = tree_cpu_seconds(worker), time.clock_gettime(clock)
    run_id = create_run(store, dag, time.time(), executors=["queue"])
    assert run_id is not None
    poke(config, run_id)
    run = wait_for(lambda: ended(store, run_id), timeout=300, what="the run to end",
                   detail=lambda: "" if scheduler.is_alive() else "the scheduler stopped")
    scheduler_cpu = time.clock_gettime(clock) - own
    worker_cpu = tree_cpu_seconds(worker) - cpu
    assert run["state"] == "success", f"the run ended {run}"
    last_outcome = max(ti["ended_at"] for ti in store.rows("run_tis", run_id=run_id))
    n = len(dag.tasks)
    return {"tasks_per_s": n / (run["ended_at"] - run["created_at"]),
            "scheduler_cpu_ms_per_task": 1000 * scheduler_cpu / n,
            "worker_cpu_ms_per_task": 1000 * worker_cpu / n,
            # created -> the scheduler started it (dispatching its tasks), and the worker's
            # last outcome -> the scheduler recording the run's end: the scheduler's share
            # of the run's wall time at its two ends
            "pickup_ms": 1000 * (run["started_at"] - run["created_at"]),
            "end_lag_ms": 1000 * (run["ended_at"] - last_outcome)}


def ended(store: Store, run_id: str) -> Row | None:
    """The run's row once it ended (its `ended_at` is what the scheduler recorded)."""
    run = store.one("run", run_id=run_id)
    return run if run is not None and run["ended_at"] is not None else None


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of `root` and its descendants so far, reaped children included
    (each process's cutime/cstime), from /proc."""
    stats: dict[int, list[str]] = {}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue            # it exited meanwhile: its parent's cutime has it
            stats[int(entry)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry))
    ticks, todo = 0, [root]
    while todo:
        pid = todo.pop()
        ticks += sum(int(v) for v in stats.get(pid, ["0"] * 15)[11:15])
        todo += children.get(pid, [])
    return ticks / os.sysconf("SC_CLK_TCK")


def cleanup(broker: str, tag: str) -> None:
    """Drop what a transport keeps outside the queues purged: a schema, Redis keys, and on
    RabbitMQ the (purged) quorum queues themselves, work-/events-/replies-/control-TAG and
    their .dead: a purged queue stays on the shared server."""
    if broker == "postgres":
        drop_schema(f"sbench{tag}")
    if broker == "redis":
        delete_redis_prefix(f"sbench{tag}")
    if broker == "rabbitmq":
        delete_rabbitmq_queues(f"-{tag}")


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


def transitions(n: int) -> list[dict[str, Any]]:
    found = [bench_transitions(f"sqlite:///{tempfile.mkdtemp()}/t.db", "sqlite", n)]
    schema = "sbench" + uuid.uuid4().hex[:8]
    try:
        found.append(bench_transitions(f"{POSTGRES}?schema={schema}", "postgres", n))
    finally:
        drop_schema(schema)
    return found


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
    parser.add_argument("--only", default=",".join(PARTS),
                        help="which parts to run, comma-separated (default: all)")
    parser.add_argument("--hops", type=int, default=200)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--state", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--worker-args", default="",
                        help="extra worker options for the fan-out, space-separated")
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    chosen = [b for b in args.brokers.split(",") if b and reachable(b)]
    results: dict[str, Any] = {"load": os.getloadavg()}
    if "hop" in parts:
        results["hop"] = [bench_hops(b, args.hops) for b in chosen]
    if "fanout" in parts:
        results["fanout"] = [bench_fanout(b, args.fanout, args.rounds, args.state,
                                          args.worker_args.split()) for b in chosen]
    if "idle" in parts:
        results["idle"] = bench_idle(args.idle)
    if "transitions" in parts:
        results["transitions"] = transitions(args.tasks)
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2) if args.json else report(results))
    return 0


def report(results: dict[str, Any]) -> str:
    before, after = results["load"], results["load_after"]
    lines = [f"load average {before[0]:.2f} {before[1]:.2f} {before[2]:.2f} before, "
             f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} after"]
    if "hop" in results:
        lines += report_hops(results["hop"])
    if "fanout" in results:
        lines += report_fanout(results["fanout"])
    if "idle" in results:
        idle = results["idle"]
        lines += [f"idle scheduler: {idle['cpu_percent']:.2f}% of a core over "
                  f"{idle['idle_seconds']:g} s, {idle['rss_mib']:.1f} MiB resident"]
    if "transitions" in results:
        lines += ["engine transitions (no broker)"]
        lines += [f"  {t['store']:10} {t['transitions_per_s']:.0f} transitions/s "
                  f"({t['transitions']} transitions)" for t in results["transitions"]]
    return "\n".join(lines)


def report_hops(hops: list[dict[str, Any]]) -> list[str]:
    lines = ["hop latency, parent success -> child start (ms); of which: the success event "
             "reaching the scheduler, and the scheduler handling it (apply + publish children)",
             f"  {'broker':10} {'p50':>7} {'p99':>7} {'reach p50':>10} {'reach p99':>10} "
             f"{'handle p50':>11} {'handle p99':>11}"]
    return lines + [f"  {h['broker']:10} {h['p50_ms']:7.2f} {h['p99_ms']:7.2f} "
                    f"{h['to_scheduler_p50_ms']:10.2f} {h['to_scheduler_p99_ms']:10.2f} "
                    f"{h['handling_p50_ms']:11.2f} {h['handling_p99_ms']:11.2f}" for h in hops]


def report_fanout(fanouts: list[dict[str, Any]]) -> list[str]:
    lines = ["fan-out, 2 worker slots: tasks/s of a run, creation to end (and of the same tasks "
             "enqueued straight to the worker, same round); CPU ms per task"]
    for f in fanouts:
        rounds = f["rounds"]
        runs = [r["fanout"]["tasks_per_s"] for r in rounds]
        ratios = [r["fanout"]["tasks_per_s"] / r["alone"]["tasks_per_s"] for r in rounds]
        lines.append(f"  {f['broker']} broker, {f['state']} state, {f['tasks']} tasks "
                     f"{' '.join(f['worker_args'])}: median {statistics.median(runs):.0f} "
                     f"tasks/s, {min(runs):.0f}-{max(runs):.0f}; "
                     f"÷ straight to the worker: median {statistics.median(ratios):.2f}")
        lines += [f"    round {i}: {r['fanout']['tasks_per_s']:6.0f} tasks/s "
                  f"(straight {r['alone']['tasks_per_s']:4.0f}); CPU/task: scheduler "
                  f"{r['fanout']['scheduler_cpu_ms_per_task']:.2f}, worker "
                  f"{r['fanout']['worker_cpu_ms_per_task']:.2f} "
                  f"(straight {r['alone']['worker_cpu_ms_per_task']:.2f}); run picked up "
                  f"{r['fanout']['pickup_ms']:.0f} ms after its creation, ended "
                  f"{r['fanout']['end_lag_ms']:.0f} ms after the last outcome"
                  for i, r in enumerate(rounds, 1)]
    return lines


if __name__ == "__main__":
    sys.exit(main())
