"""Runs and their task instances, as JSON-ready documents."""

from __future__ import annotations

import json
from typing import Any

from conveyor.scheduler.runs import iso
from conveyor.state.store import Store

#: Run states a filter may name; a run ends in one of DONE.
STATES = ("queued", "running", "success", "failed")
DONE = ("success", "failed")
#: The far future, for an open-ended date filter (Unix seconds).
NEVER = 1e13


def value(stored: str | None) -> Any:
    """A stored result (JSON text) as data; None when the task returned nothing (yet)."""
    return json.loads(stored) if stored else None


def short(stored: str | None, width: int = 40) -> str:
    """A stored result for a table cell: its JSON, cut to `width` with an ellipsis."""
    if stored is None:
        return ""
    return stored if len(stored) <= width else stored[:width - 1] + "…"


def took(row: dict[str, Any]) -> float | None:
    """Seconds from start to end of a run, task instance or attempt; None until it ended."""
    if row.get("ended_at") and row.get("started_at"):
        return float(row["ended_at"] - row["started_at"])
    return None


def task_doc(ti: dict[str, Any]) -> dict[str, Any]:
    """A task instance with its spec and result as data (not JSON text)."""
    return {**ti, "spec": json.loads(ti["spec"]), "result": value(ti.get("result"))}


def attempt_doc(attempt: dict[str, Any]) -> dict[str, Any]:
    """An attempt with its result as data, its duration, and its last lines of output."""
    return {**attempt, "result": value(attempt.get("result")), "took": took(attempt),
            "log": json.loads(attempt["log"]) if attempt.get("log") else []}


def find_runs(store: Store, *, dag_id: str = "", state: str = "", since: float = 0.0,
              until: float = NEVER, limit: int = 100) -> list[dict[str, Any]]:
    """Runs newest first, of one DAG and/or in one state ('' = any), whose logical date is
    in [since, until)."""
    return store.rows("find_runs", dag_id=dag_id, state=state, since=since, until=until,
                      limit=limit)


def run_detail(store: Store, run_id: str) -> dict[str, Any] | None:
    """One run with its task instances, their attempts and the DAG's edges; None if absent."""
    run = store.one("run", run_id=run_id)
    if run is None:
        return None
    tasks = store.rows("run_tis", run_id=run_id)
    attempts = store.rows("run_attempts", run_id=run_id)
    edges = store.rows("run_edges", run_id=run_id)
    return {"run": run, "tasks": [task_doc(t) for t in tasks],
            "attempts": [attempt_doc(a) for a in attempts],
            "edges": [[e["upstream"], e["downstream"]] for e in edges]}


def task_detail(store: Store, run_id: str, task_id: str) -> dict[str, Any] | None:
    """One task instance and every attempt of it; None if the run has no such task."""
    ti = store.one("run_ti_by_task", run_id=run_id, task_id=task_id)
    if ti is None:
        return None
    attempts = store.rows("ti_attempts", ti_id=ti["ti_id"])
    return {"task": task_doc(ti), "attempts": [attempt_doc(a) for a in attempts]}


def run_rows(store: Store, limit: int) -> list[dict[str, Any]]:
    """The newest runs, each with its tasks' states (what `conveyor status` shows)."""
    rows = []
    for run in store.rows("recent_runs", dag_id="", state="", limit=limit):
        tasks = store.rows("run_tis", run_id=run["run_id"])
        rows.append({"run_id": run["run_id"], "dag_id": run["dag_id"], "state": run["state"],
                     "created": iso(run["created_at"]), "ended": iso(run["ended_at"]),
                     "tasks": {t["task_id"]: {"state": t["state"], "attempt": t["attempt"]}
                               for t in tasks}})
    return rows
