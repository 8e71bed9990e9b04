"""DAGs as operators see them: what the folder defines, joined with what the store knows
(paused, next tick, last run)."""

from __future__ import annotations

from typing import Any

from conveyor.scheduler.dag import DAG
from conveyor.scheduler.folder import Loaded
from conveyor.scheduler.runs import iso
from conveyor.state.records import Dag, Run
from conveyor.state.runs import Dags, Runs
from conveyor.state.store import Store


def dag_rows(loaded: Loaded, store: Store) -> list[dict[str, Any]]:
    """One row per DAG the folder loads, in the folder's order."""
    known = {dag.dag_id: dag for dag in Dags(store).all()}
    last = {run.dag_id: run for run in Runs(store).last_of_each_dag()}
    return [dag_row(dag, known.get(dag.dag_id), last.get(dag.dag_id))
            for dag in loaded.dags.values()]


def dag_row(dag: DAG, known: Dag | None, last: Run | None) -> dict[str, Any]:
    schedule = dag.schedule or (str(dag.assets) if dag.assets is not None else "")
    return {"dag_id": dag.dag_id, "schedule": schedule, "tasks": len(dag.tasks),
            "version": dag.version, "file": dag.file,
            "next_run": iso(known.next_tick) if known and known.next_tick else "",
            "last_run": last.run_id if last else "",
            "last_state": last.state if last else "",
            "paused": bool(known and known.paused)}


def load_errors(loaded: Loaded) -> list[dict[str, Any]]:
    """The DAG files that did not load: file, line, and the error."""
    return [{"file": e.location.file if e.location else "",
             "line": e.location.line if e.location else 0, "error": str(e)}
            for e in loaded.errors]
