"""Turning a DAG into a run: one row for the run, a task instance per task, and the edges.

A run is a snapshot: each task instance carries its own spec (what to run, limits, retry
policy) and the run keeps the DAG's version, so editing a DAG file never changes a run that
has started. Runs are unique per (DAG, logical date): a cron tick seen by two schedulers, or
by one that restarted, inserts one run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.message import new_id
from conveyor.scheduler import branches
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.deadlines import set_alerts
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.pinning import pin_spec
from conveyor.state.runs import Runs
from conveyor.state.store import Store


def create_run(store: Store, dag: DAG, now: float, *, executors: Sequence[str],
               conf: Mapping[str, Any] | None = None, logical_date: float | None = None,
               run_type: str = "manual", pin_code: bool | None = None,
               triggered_by: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """Insert a queued run of `dag`; its id, or None if (DAG, logical date) already exists.
    `pin_code`: pin this run to its code (None: as the DAG says; scheduler/pinning.py).
    `triggered_by`: the asset events that started it (its tasks' context, asset_runs.py).

    The scheduler starts queued runs on its next tick (`Engine.tick`).
    """
    if not executors:
        raise RunError("no executor is configured: set --executors (CONVEYOR_EXECUTORS)")
    run_id = new_id(now)
    date = now if logical_date is None else logical_date
    extra: dict[str, Any] = {"logical_date": iso(date)}   # tasks see these in their headers
    extra |= {"conf": dict(conf)} if conf else {}
    extra |= {"asset_events": [dict(event) for event in triggered_by]} if triggered_by else {}
    if dag.pin_code if pin_code is None else pin_code:
        extra["pin"] = pin_spec(dag.pin_timeout, dag.pin_policy)
    runs = Runs(store)
    with store.transaction():
        inserted = runs.insert(run_id=run_id, dag_id=dag.dag_id, logical_date=date,
                               run_type=run_type, conf=json.dumps(dict(conf or {})),
                               dag_version=dag.version or "unversioned", now=now)
        if not inserted:
            return None
        if dag.source:   # once per version: a run shows the source it was created from
            runs.keep_source(version=dag.version, file=dag.file, source=dag.source, now=now)
        children: dict[str, list[str]] = {}
        for upstream, downstream in dag.edges():
            children.setdefault(upstream, []).append(downstream)
        runs.insert_task_instances([ti_row(dag, task_id, position, run_id, now, executors,
                                           extra, children.get(task_id, []))
                                    for position, task_id in enumerate(dag.order())])
        runs.insert_edges(run_id, list(dag.edges()))
        if dag.callbacks or dag.deadline:   # a backfill's runs are late by design: no deadline
            set_alerts(store, dag, run_id, logical_date=date, queued_at=now,
                       deadline=run_type != "backfill")
    return run_id


def ti_row(dag: DAG, task_id: str, position: int, run_id: str, now: float,
           executors: Sequence[str], extra: Mapping[str, Any], children: list[str]
           ) -> dict[str, Any]:
    """The `insert_ti` parameters of one task of a new run. Its spec lists the task's
    children (a snapshot, like the edges): a success of a task with none looks for none."""
    node = dag.tasks[task_id]
    o = node.options
    spec = {**node.spec(), **extra, "downstream": sorted(children)}
    if node.branch:     # which tasks each child leads to: see branches.follows
        spec["branch"] = branches.reach(sorted(children), dag.edges())
    return {"ti_id": new_id(now), "run_id": run_id, "task_id": task_id, "position": position,
            "max_attempts": o.max_attempts, "executor": o.executor or executors[0],
            "queue": o.queue, "priority": o.priority, "spec": json.dumps(spec),
            "queued_timeout": o.queued_timeout, "heartbeat_timeout": o.heartbeat_timeout,
            "is_branch": int(node.branch)}


def trigger(store: Store, dag: DAG, now: float, *, executors: Sequence[str],
            conf: Mapping[str, Any] | None = None, logical_date: float | None = None,
            run_type: str = "manual", pin_code: bool | None = None) -> str:
    """Like `create_run`, but a run that already exists for the date is an error to show."""
    run_id = create_run(store, dag, now, executors=executors, conf=conf,
                        logical_date=logical_date, run_type=run_type, pin_code=pin_code)
    if run_id is None:
        date = now if logical_date is None else logical_date
        existing = Runs(store).by_date(dag.dag_id, date)
        raise RunError(f"DAG {dag.dag_id!r} already has a run for {iso(date)} "
                       f"({existing.run_id if existing else '?'}): pass another "
                       "--logical-date")
    return run_id


def iso(ts: float | None) -> str:
    """Unix seconds as an ISO-8601 UTC time, for people."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
