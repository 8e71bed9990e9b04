"""The DAGs and runs the schedulers keep: typed reads and guarded writes over named queries.

Every method is one named query (see sql/*.sql); a caller that needs several to commit
together brackets them in `store.transaction()`. The task instances of a run and their
attempts are in `state/tasks.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.state.records import Dag, Finished, GridCell, Run
from conveyor.state.store import Repository


class Dags(Repository):
    """The DAGs the schedulers loaded: version, schedule, next tick, pause, run cap."""

    def all(self) -> list[Dag]:
        return [Dag.from_row(row) for row in self.store.rows("dags")]

    def get(self, dag_id: str) -> Dag | None:
        row = self.store.one("dag_row", dag_id=dag_id)
        return None if row is None else Dag.from_row(row)

    def upsert(self, *, dag_id: str, version: str, file: str, schedule: str | None,
               timezone: str, next_tick: float | None, now: float) -> None:
        """Record a loaded DAG; a tick already recorded for the same schedule is kept."""
        self.store.exec("upsert_dag", dag_id=dag_id, version=version, file=file,
                        schedule=schedule, timezone=timezone, next_tick=next_tick, now=now)

    def set_max_active_runs(self, dag_id: str, max_active_runs: int | None) -> None:
        self.store.exec("set_max_active_runs", dag_id=dag_id, max_active_runs=max_active_runs)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.store.exec("set_paused", dag_id=dag_id, paused=int(paused))

    def advance_tick(self, *, dag_id: str, next_tick: float | None, expected: float) -> bool:
        """Move the DAG's next tick on, if it is still `expected` (no other scheduler did)."""
        return bool(self.store.exec("advance_tick", dag_id=dag_id, next_tick=next_tick,
                                    expected=expected))

    def active_runs(self, dag_id: str) -> int:
        """How many of the DAG's runs are queued or running."""
        row = self.store.one("dag_active_runs", dag_id=dag_id)
        return int(row["n"]) if row else 0


class Runs(Repository):
    """DAG runs, their edges, and the transitions a whole run makes."""

    def get(self, run_id: str) -> Run | None:
        row = self.store.one("run", run_id=run_id)
        return None if row is None else Run.from_row(row)

    def many(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """These runs by id, in one query (those that do not exist are left out)."""
        return {row["run_id"]: Run.from_row(row) for row in self.store.rows(
            "runs_by_ids", run_ids=json.dumps(sorted(run_ids)))}

    def by_date(self, dag_id: str, logical_date: float) -> Run | None:
        row = self.store.one("run_by_date", dag_id=dag_id, logical_date=logical_date)
        return None if row is None else Run.from_row(row)

    def last_of_each_dag(self) -> list[Run]:
        """Each DAG's run of the latest logical date."""
        return [Run.from_row(row) for row in self.store.rows("last_runs")]

    def recent(self, limit: int, *, dag_id: str = "", state: str = "") -> list[Run]:
        """The newest runs by creation, of one DAG and/or in one state ('' = any)."""
        return [Run.from_row(row) for row in self.store.rows(
            "recent_runs", dag_id=dag_id, state=state, limit=limit)]

    def find(self, *, dag_id: str, state: str, since: float, until: float,
             limit: int) -> list[Run]:
        """Newest logical date first, in [since, until), by DAG and state ('' = any)."""
        return [Run.from_row(row) for row in self.store.rows(
            "find_runs", dag_id=dag_id, state=state, since=since, until=until, limit=limit)]

    def active_count(self) -> int:
        """How many runs are queued or running, of every DAG."""
        row = self.store.one("active_runs")
        return int(row["n"]) if row else 0

    def count_by_state(self) -> dict[str, int]:
        return {row["state"]: int(row["n"]) for row in self.store.rows("runs_by_state")}

    def edges(self, run_id: str) -> list[tuple[str, str]]:
        """(upstream, downstream) task ids of the run's DAG, as it was when the run began."""
        return [(row["upstream"], row["downstream"])
                for row in self.store.rows("run_edges", run_id=run_id)]

    def grid(self, dag_id: str, limit: int) -> list[GridCell]:
        """The task instances of the DAG's `limit` newest runs (by logical date)."""
        return [GridCell.from_row(row)
                for row in self.store.rows("dag_grid", dag_id=dag_id, limit=limit)]

    def insert(self, *, run_id: str, dag_id: str, logical_date: float, run_type: str,
               conf: str, dag_version: str, now: float) -> bool:
        """A queued run; False if the DAG already has one for that logical date."""
        return bool(self.store.exec("insert_run", run_id=run_id, dag_id=dag_id,
                                    logical_date=logical_date, run_type=run_type, conf=conf,
                                    dag_version=dag_version, now=now))

    def insert_task_instances(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """The pending task instances of a new run, in one round trip."""
        self.store.exec_many("insert_ti", rows)

    def insert_edges(self, run_id: str, edges: Sequence[tuple[str, str]]) -> None:
        self.store.exec_many("insert_edge", [{"run_id": run_id, "upstream": u,
                                              "downstream": d} for u, d in edges])

    def set_code_version(self, run_id: str, code_version: str) -> None:
        """The code version its first task started on (one already recorded is kept)."""
        self.store.exec("set_run_code_version", run_id=run_id, code_version=code_version)

    def repin(self, run_id: str, code_version: str | None) -> None:
        """Move a run to another code version (None: to the next one its tasks start on)."""
        self.store.exec("repin_run", run_id=run_id, code_version=code_version)

    def code_versions(self, run_ids: Sequence[str]) -> dict[str, str | None]:
        """Each run's code version (None: no task of it started yet)."""
        return {row["run_id"]: row["code_version"] for row in self.store.rows(
            "run_code_versions", run_ids=json.dumps(sorted(run_ids)))}

    def keep_source(self, *, version: str, file: str, source: str, now: float) -> None:
        """A DAG file's source, kept once per version (its hash)."""
        self.store.exec("put_dag_source", version=version, file=file, source=source, now=now)

    def source(self, version: str) -> dict[str, Any] | None:
        """The source kept for a DAG version ({version, file, source}); None if none."""
        row = self.store.one("dag_source", version=version)
        return None if row is None else {k: row[k] for k in ("version", "file", "source")}

    def lock(self, run_id: str) -> bool:
        """Lock the run's row for the rest of the transaction (Postgres); False if absent."""
        return self.store.one("lock_run", run_id=run_id) is not None

    def start_queued(self, *, now: float, limit: int) -> list[str]:
        """Start queued runs oldest first, within each DAG's cap and pause: their ids."""
        return [row["run_id"] for row in self.store.rows("start_queued_runs", now=now,
                                                         limit=limit)]

    def finish(self, run_id: str, now: float) -> Finished | None:
        """End a running run (or a queued one cancelled as a whole) if nothing in it is left
        to do; how it ended, else None."""
        row = self.store.one("finish_run", run_id=run_id, now=now)
        return None if row is None else Finished.from_row(row)

    def cancel(self, run_id: str, now: float) -> bool:
        """Mark a queued or running run cancelled as a whole (it ends `cancelled` once
        nothing in it runs); False if it had ended or was cancelled already."""
        return bool(self.store.exec("cancel_run", run_id=run_id, now=now))

    def reopen(self, run_id: str) -> None:
        """Back to queued: the next scheduler tick starts it (after a clear or a mark)."""
        self.store.exec("reopen_run", run_id=run_id)
