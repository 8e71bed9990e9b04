"""Deadlines of runs: set when a run is created, found by the scheduler's tick when passed.

A run of a DAG with `deadline=Deadline(...)` keeps the deadline's spec (`alerts`, with the
DAG's callbacks) and when it must have ended (`deadline_at`, computed once from the run's
logical date or creation time). The tick marks each run that has not ended by then as having
missed it (`deadline_missed_at`: one guarded UPDATE, so two schedulers mark it once) and, in
the same transaction, records the deadline's callback (`callbacks.py` publishes it). None of
this needs a worker: the miss is recorded, and the callback queued, on time even while every
worker is down; the callback itself runs when a worker takes it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from conveyor.scheduler.alerts import deadline_at
from conveyor.scheduler.callbacks import Sender
from conveyor.scheduler.dag import DAG
from conveyor.state.callbacks import Callbacks
from conveyor.state.runs import Runs
from conveyor.state.store import Store

log = logging.getLogger("conveyor.scheduler.deadlines")

BATCH = 200


def set_alerts(store: Store, dag: DAG, run_id: str, *, logical_date: float,
               queued_at: float, deadline: bool = True) -> None:
    """Keep the DAG's callbacks and deadline (unless `deadline` is False) with its new run
    (the caller's transaction)."""
    alerts: dict[str, Any] = dict(dag.callbacks)
    due = None
    if dag.deadline is not None and deadline:
        alerts["deadline"] = dag.deadline
        due = deadline_at(dag.deadline, logical_date=logical_date, queued_at=queued_at)
    if alerts:
        Callbacks(store).set_run_alerts(run_id, json.dumps(alerts), due)


def fire_due(store: Store, sender: Sender, now: float) -> None:
    """Mark every run whose deadline passed unended as having missed it, and record the
    deadline's callback with the mark."""
    table = Callbacks(store)
    while True:
        due = table.deadlines_due(now, BATCH)
        for run_id in due:
            with store.transaction():
                Runs(store).lock(run_id)
                missed = table.miss_deadline(run_id, now)
                if missed is not None:
                    late = now - (missed.deadline_at or now)
                    log.warning("run %s of DAG %s missed its deadline (%s ago, still %s); "
                                "its deadline callback, if any, is queued", run_id,
                                missed.dag_id, f"{late:.0f} s", missed.state)
                    sender.deadline_missed(missed, now)
        if len(due) < BATCH:
            return


def next_due(store: Store) -> float | None:
    """The earliest deadline of a run that has not ended and not missed it yet."""
    return Callbacks(store).next_run_deadline()
