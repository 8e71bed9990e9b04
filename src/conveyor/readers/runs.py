"""Runs and their task instances, as JSON-ready documents: the one shape of each, the
same for `runs show --json`, `tasks show --json`, `runs list --json` and the dashboard's
JSON API (a run, a task instance, an attempt: every column of its row, with what is stored
as JSON text given as data)."""

from __future__ import annotations

import json
from typing import Any

from conveyor.scheduler.pinning import waiting_reason
from conveyor.scheduler.runs import iso
from conveyor.state.callbacks import Callbacks
from conveyor.state.maps import Maps
from conveyor.state.records import Attempt, TaskInstance
from conveyor.state.runs import Dags, Runs
from conveyor.state.store import Store
from conveyor.state.tasks import Attempts, TaskInstances

#: Run states a filter may name; a run ends in one of DONE.
STATES = ("queued", "running", "success", "failed", "cancelled")
DONE = ("success", "failed", "cancelled")
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


def short_value(data: Any, width: int = 40) -> str:
    """A document's result for a table cell: `short` of its JSON; blank when None."""
    return "" if data is None else short(json.dumps(data), width)


def took(row: dict[str, Any]) -> float | None:
    """Seconds from start to end of a run, task instance or attempt; None until it ended,
    and None for a start recorded after the end (`started_late`), never a negative time."""
    if row.get("ended_at") and row.get("started_at") and row["ended_at"] >= row["started_at"]:
        return float(row["ended_at"] - row["started_at"])
    return None


def started_late(row: dict[str, Any]) -> bool:
    """Whether an attempt's start was recorded after its end: it was timed out for not
    starting, then started on a worker whose clock is behind the scheduler's by more than
    the start grace (the scheduler logs that as an error)."""
    return bool(row.get("ended_at") and row.get("started_at")
                and row["started_at"] > row["ended_at"])


def budget_attempt(ti: dict[str, Any]) -> tuple[int, int]:
    """(attempt, of how many) within the task instance's current budget: a cleared task has
    a fresh budget (`tries` attempts from where it was cleared; attempt numbers keep
    counting up in the store), so its first try after the clear reads 1/3, not 2/4."""
    tries = ti.get("tries") or ti["max_attempts"]
    spent_before = ti["max_attempts"] - tries
    return max(ti["attempt"] - spent_before, 0), tries


def map_summary(tasks: list[dict[str, Any]]) -> dict[str, str]:
    """Each mapped task's instances in a few words, by its task id ("3 mapped: 2 success,
    1 running"), from a run's task documents."""
    states: dict[str, dict[str, int]] = {}
    for ti in tasks:
        if ti.get("map_task"):
            counts = states.setdefault(ti["map_task"], {})
            counts[ti["state"]] = counts.get(ti["state"], 0) + 1
    return {task: f"{sum(c.values())} mapped: "
                  + ", ".join(f"{n} {state}" for state, n in sorted(c.items()))
            for task, c in states.items()}


def map_instances(store: Store, run_id: str, task_id: str) -> list[dict[str, Any]]:
    """A mapped task's instances, by map index ([] for a task that is not mapped)."""
    return [task_doc(ti) for ti in Maps(store).instances(run_id, task_id)]


def task_doc(ti: TaskInstance) -> dict[str, Any]:
    """A task instance with its spec and result as data (not JSON text)."""
    return {**ti.doc(), "spec": dict(ti.spec), "result": value(ti.result)}


def attempt_doc(attempt: Attempt) -> dict[str, Any]:
    """An attempt with its result as data, its duration, and its last lines of output."""
    doc = attempt.doc()
    return {**doc, "result": value(attempt.result), "took": took(doc),
            "log": json.loads(attempt.log) if attempt.log else []}


def run_doc(store: Store, run_id: str) -> dict[str, Any] | None:
    """One run's row; None if absent."""
    run = Runs(store).get(run_id)
    return None if run is None else run.doc()


def run_on(store: Store, dag_id: str, logical_date: float) -> dict[str, Any] | None:
    """The DAG's run of that logical date; None if it has none."""
    run = Runs(store).by_date(dag_id, logical_date)
    return None if run is None else run.doc()


def recent_runs(store: Store, limit: int) -> list[dict[str, Any]]:
    """The newest runs by creation, newest first."""
    return [run.doc() for run in Runs(store).recent(limit)]


def run_tasks(store: Store, run_id: str) -> list[dict[str, Any]]:
    """A run's task instances in DAG order."""
    return [task_doc(ti) for ti in TaskInstances(store).of_run(run_id)]


def dag_ids(store: Store) -> list[str]:
    """The DAGs the schedulers recorded, by id."""
    return [dag.dag_id for dag in Dags(store).all()]


def grid(store: Store, dag_id: str, limit: int) -> list[dict[str, Any]]:
    """The task instances of the DAG's `limit` newest runs, for a grid of runs x tasks."""
    return [cell.doc() for cell in Runs(store).grid(dag_id, limit)]


def find_runs(store: Store, *, dag_id: str = "", state: str = "", since: float = 0.0,
              until: float = NEVER, limit: int = 100) -> list[dict[str, Any]]:
    """Runs newest first, of one DAG and/or in one state ('' = any), whose logical date is
    in [since, until)."""
    found = Runs(store).find(dag_id=dag_id, state=state, since=since, until=until, limit=limit)
    return [{**run.doc(), "took": took(run.doc())} for run in found]


def run_detail(store: Store, run_id: str) -> dict[str, Any] | None:
    """One run with its task instances, their attempts and the DAG's edges; None if absent."""
    run = Runs(store).get(run_id)
    if run is None:
        return None
    tasks = run_tasks(store, run_id)
    return {"run": run.doc(), "tasks": tasks, "code": code_doc(run.code_version, tasks),
            "attempts": [attempt_doc(a) for a in Attempts(store).of_run(run_id)],
            "edges": [[u, d] for u, d in Runs(store).edges(run_id)],
            "deadline": deadline_doc(run.deadline_at, run.deadline_missed_at, run.ended_at),
            "callbacks": run_callbacks(store, run_id)}


def code_doc(version: str | None, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The code a run ran: the version its first task started on, whether the run is pinned
    to it (scheduler/pinning.py), and the tasks held for want of a worker of it, each with
    the reason the dashboard shows."""
    waiting = {t["task_id"]: waiting_reason(t["waiting_for"]) for t in tasks
               if t.get("waiting_for") and t["state"] == "queued" and not t["published_at"]}
    return {"version": version, "pinned": any("pin" in t["spec"] for t in tasks),
            "waiting": waiting}


def run_source(store: Store, run_id: str) -> dict[str, Any] | None:
    """The DAG file's source the run was created from ({version, file, source}); None if
    the run is absent or its version's source was not kept (a run older than the table,
    or one `submit` built without a file)."""
    run = Runs(store).get(run_id)
    return None if run is None else Runs(store).source(run.dag_version)


def deadline_doc(at: float | None, missed_at: float | None, ended_at: float | None
                 ) -> dict[str, Any] | None:
    """A run's deadline: when, and whether it was missed (None: the run has none).
    `status`: missed, met (ended in time), or pending."""
    if at is None:
        return None
    status = "missed" if missed_at is not None else "met" if ended_at is not None else "pending"
    return {"at": at, "missed_at": missed_at, "missed": missed_at is not None,
            "status": status}


def run_callbacks(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The callbacks a run fired (and its deadline's), oldest first, with the task id of
    the task instance that fired each ('' for the run's own)."""
    names = {ti.ti_id: ti.task_id for ti in TaskInstances(store).of_run(run_id)}
    return [{**record.doc(), "task_id": names.get(record.ti_id, ""),
             "context": value(record.context)} for record in Callbacks(store).of_run(run_id)]


def task_detail(store: Store, run_id: str, task_id: str) -> dict[str, Any] | None:
    """One task instance and every attempt of it, and a mapped task's instances by index
    ([] for any other); None if the run has no such task."""
    ti = TaskInstances(store).by_task(run_id, task_id)
    if ti is None:
        return None
    attempts = Attempts(store).of_task_instance(ti.ti_id)
    instances = map_instances(store, run_id, task_id) if ti.map_count else []
    return {"task": task_doc(ti), "attempts": [attempt_doc(a) for a in attempts],
            "instances": instances}


def run_rows(store: Store, limit: int) -> list[dict[str, Any]]:
    """The newest runs, each with its tasks' states (what `conveyor status` shows)."""
    rows = []
    for run in Runs(store).recent(limit):
        tasks = TaskInstances(store).of_run(run.run_id)
        rows.append({"run_id": run.run_id, "dag_id": run.dag_id, "state": run.state,
                     "created": iso(run.created_at), "ended": iso(run.ended_at),
                     "tasks": {t.task_id: {"state": t.state, "attempt": t.attempt}
                               for t in tasks}})
    return rows
