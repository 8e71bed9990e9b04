"""`conveyor status`: the whole system at a glance — queues, workers, recent runs.

Queues: ready, in flight, delayed and dead, for the queues in use (`-Q` adds others).
Workers: from the registry each worker keeps fresh in the state store; one whose last
heartbeat is older than three intervals is marked STALE (killed, frozen or cut off).
Schedulers: those whose lease in the state store holds (none: nothing moves the runs).
Runs: the newest, with how many of their tasks are in each state.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from conveyor.broker import Administrator
from conveyor.cli.connections import (
    broker_url,
    connection_flags,
    nothing_yet,
    opened_broker,
    opened_store,
    state_url,
)
from conveyor.cli.output import output, table
from conveyor.config import checked
from conveyor.kinds import non_negative_int
from conveyor.readers.queue_history import live_schedulers
from conveyor.readers.queues import known_queues, queue_rows
from conveyor.readers.runs import run_rows
from conveyor.readers.workers import worker_rows
from conveyor.scheduler.runs import iso
from conveyor.state.store import Store

#: What `status` says when no scheduler's lease holds.
NO_SCHEDULER = ("none running: runs stay as they are and what workers report waits on "
                "conveyor.scheduler.events until one runs (`conveyor scheduler`)")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("status", help="queues, workers and recent runs at a glance",
                            description=__doc__)
    p.add_argument("-Q", "--queue", action="append", default=[], help="also show this queue "
                   "(repeatable)")
    p.add_argument("--runs", type=checked(non_negative_int), default=10,
                   help="recent runs to show (default 10)")
    connection_flags(p)
    p.set_defaults(run=run_status)


def collect(store: Store | None, broker: Administrator | None, extra_queues: list[str], runs: int,
            now: float) -> dict[str, Any]:
    """Everything `status` shows, as one JSON-ready document (a store or broker that does
    not exist yet, None, holds nothing)."""
    names = known_queues(store, extra_queues, broker)
    return {"at": iso(now),
            "queues": queue_rows(broker, names) if broker else [_empty(q) for q in names],
            "workers": worker_rows(store, now) if store else [],
            "schedulers": scheduler_rows(store, now) if store else [],
            "runs": run_rows(store, runs) if store else []}


def scheduler_rows(store: Store, now: float) -> list[dict[str, Any]]:
    """The schedulers whose lease holds: without one, runs do not move and what workers
    report waits on the events queue."""
    return [{"scheduler": s["scheduler_id"], "host": s["hostname"], "pid": s["pid"]}
            for s in live_schedulers(store, now)]


def _empty(queue: str) -> dict[str, Any]:
    return {"queue": queue, "ready": 0, "in_flight": 0, "delayed": 0, "dead": 0}


def run_status(args: argparse.Namespace) -> int:
    """Reading creates nothing: an embedded store or broker file that does not exist yet is
    shown empty, and the first line says so."""
    missing = nothing_yet(state_url(args)) or nothing_yet(broker_url(args))
    with ExitStack() as opened:
        store = None if nothing_yet(state_url(args)) else opened.enter_context(
            opened_store(args))
        broker = None if nothing_yet(broker_url(args)) else opened.enter_context(
            opened_broker(args))
        doc = collect(store, broker, list(args.queue), args.runs, time.time())
    if args.json:
        output(doc, [], [], True)
        return 0
    if missing:
        print(f"nothing has run yet: {missing}\n")
    print("queues")
    print(table(doc["queues"], ["queue", "ready", "in_flight", "delayed", "dead"]))
    print("\nworkers" + ("" if doc["workers"] else ": none registered (workers register "
                         "in the state store they are given with --state)"))
    if doc["workers"]:
        print(table([{**w, "last_heartbeat": f"{w['seconds_ago']:g}s ago",
                      "state": "STALE" if w["stale"] else "ok"} for w in doc["workers"]],
                    ["host", "pid", "queues", "code_version", "busy", "free",
                     "last_heartbeat", "state"]))
    print("\nschedulers: " + (", ".join(f"{s['host']} pid {s['pid']}"
                                        for s in doc["schedulers"]) or NO_SCHEDULER))
    print("\nrecent runs" + ("" if doc["runs"] else ": none"))
    if doc["runs"]:
        print(table([{**r, "tasks": _tally(r["tasks"])} for r in doc["runs"]],
                    ["run_id", "dag_id", "state", "created", "tasks"]))
    return 0


def _tally(tasks: dict[str, dict[str, Any]]) -> str:
    counts = Counter(t["state"] for t in tasks.values())
    return ", ".join(f"{state} {n}" for state, n in sorted(counts.items()))
