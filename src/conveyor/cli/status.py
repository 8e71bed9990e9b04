"""`conveyor status`: the whole system at a glance — queues, workers, recent runs.

Queues: ready, in flight, delayed and dead, for the queues in use (`-Q` adds others).
Workers: from the registry each worker keeps fresh in the state store; one whose last
heartbeat is older than three intervals is marked STALE (killed, frozen or cut off).
Runs: the newest, with how many of their tasks are in each state.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from conveyor.broker import Broker
from conveyor.cli.connections import connection_flags, opened_broker, opened_store
from conveyor.cli.output import output, table
from conveyor.config import checked, non_negative_int
from conveyor.readers.queues import known_queues, queue_rows
from conveyor.readers.runs import run_rows
from conveyor.readers.workers import worker_rows
from conveyor.scheduler.runs import iso
from conveyor.state.store import Store


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("status", help="queues, workers and recent runs at a glance",
                            description=__doc__)
    p.add_argument("-Q", "--queue", action="append", default=[], help="also show this queue "
                   "(repeatable)")
    p.add_argument("--runs", type=checked(non_negative_int), default=10,
                   help="recent runs to show (default 10)")
    connection_flags(p)
    p.set_defaults(run=run_status)


def collect(store: Store, broker: Broker, extra_queues: list[str], runs: int,
            now: float) -> dict[str, Any]:
    """Everything `status` shows, as one JSON-ready document."""
    return {"at": iso(now), "queues": queue_rows(broker, known_queues(store, extra_queues)),
            "workers": worker_rows(store, now), "runs": run_rows(store, runs)}


def run_status(args: argparse.Namespace) -> int:
    with opened_store(args) as store, opened_broker(args) as broker:
        doc = collect(store, broker, list(args.queue), args.runs, time.time())
    if args.json:
        output(doc, [], [], True)
        return 0
    print("queues")
    print(table(doc["queues"], ["queue", "ready", "in_flight", "delayed", "dead"]))
    print("\nworkers" + ("" if doc["workers"] else ": none registered (workers register "
                         "in the state store they are given with --state)"))
    if doc["workers"]:
        print(table([{**w, "last_heartbeat": f"{w['seconds_ago']:g}s ago",
                      "state": "STALE" if w["stale"] else "ok"} for w in doc["workers"]],
                    ["host", "pid", "queues", "busy", "free", "last_heartbeat", "state"]))
    print("\nrecent runs" + ("" if doc["runs"] else ": none"))
    if doc["runs"]:
        print(table([{**r, "tasks": _tally(r["tasks"])} for r in doc["runs"]],
                    ["run_id", "dag_id", "state", "created", "tasks"]))
    return 0


def _tally(tasks: dict[str, dict[str, Any]]) -> str:
    counts = Counter(t["state"] for t in tasks.values())
    return ", ".join(f"{state} {n}" for state, n in sorted(counts.items()))
