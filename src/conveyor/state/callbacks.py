"""Callbacks fired and deadlines missed: typed reads and guarded writes over named queries.

A callback row is written in the transaction of the transition that fires it, unique per
(task instance, attempt, kind) or (run, kind), so it is recorded at most once; its publish is
claimed like an attempt's (`scheduler`, `lease`), so it is published at least once. See
`scheduler/callbacks.py` for who calls what, and sql/*.sql (migration_0014) for the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.state.records import CallbackRecord
from conveyor.state.store import Repository


@dataclass(frozen=True)
class RunAlerts:
    """What a run keeps of its DAG's callbacks and deadline."""

    run_id: str
    dag_id: str
    logical_date: float
    state: str
    alerts: str | None
    deadline_at: float | None
    deadline_missed_at: float | None

    @classmethod
    def from_row(cls, row: Any) -> RunAlerts:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})


class Callbacks(Repository):
    """The callbacks table, and the deadline columns of runs."""

    # -- runs' alerts -----------------------------------------------------------------------

    def set_run_alerts(self, run_id: str, alerts: str | None, deadline_at: float | None
                       ) -> None:
        self.store.exec("set_run_alerts", run_id=run_id, alerts=alerts,
                        deadline_at=deadline_at)

    def run_alerts(self, run_id: str) -> RunAlerts | None:
        row = self.store.one("run_alerts", run_id=run_id)
        return None if row is None else RunAlerts.from_row(row)

    def deadlines_due(self, now: float, limit: int) -> list[str]:
        """Runs not ended whose deadline passed and was not yet marked missed."""
        return [row["run_id"] for row in self.store.rows("deadlines_due", now=now,
                                                         limit=limit)]

    def miss_deadline(self, run_id: str, now: float) -> RunAlerts | None:
        """Mark the run as having missed its deadline, if it has and no one marked it."""
        row = self.store.one("miss_deadline", run_id=run_id, now=now)
        return None if row is None else RunAlerts.from_row(row)

    def next_run_deadline(self) -> float | None:
        return _at(self.store.one("next_run_deadline"))

    def deadlines_missed(self) -> int:
        row = self.store.one("deadlines_missed")
        return int(row["n"]) if row else 0

    # -- callbacks --------------------------------------------------------------------------

    def record(self, *, callback_id: str, run_id: str, ti_id: str, attempt: int, kind: str,
               task: str, executor: str, queue: str, context: str, scheduler: str,
               lease: float, now: float) -> bool:
        """Record a fired callback, claimed by `scheduler`; False if it was already."""
        return bool(self.store.exec(
            "record_callback", callback_id=callback_id, run_id=run_id, ti_id=ti_id,
            attempt=attempt, kind=kind, task=task, executor=executor, queue=queue,
            context=context, scheduler=scheduler, lease=lease, now=now))

    def claimed(self, scheduler: str, limit: int) -> list[CallbackRecord]:
        return _records(self.store.rows("claimed_callbacks", scheduler=scheduler,
                                        limit=limit))

    def claim_lapsed(self, *, scheduler: str, lease: float, now: float, limit: int
                     ) -> list[CallbackRecord]:
        """Pending callbacks whose claimer is dead (or none), now claimed by `scheduler`."""
        found = _records(self.store.rows("claim_lapsed_callbacks", scheduler=scheduler,
                                         lease=lease, now=now, limit=limit))
        self.store.exec("wait_for_callback_claimers", now=now)
        return found

    def published(self, callback_id: str, now: float) -> None:
        self.store.exec("callback_published", callback_id=callback_id, now=now)

    def ended(self, callback_id: str, *, state: str, error: str | None, now: float) -> bool:
        """Record a callback's outcome; False if it had one (a duplicate event)."""
        return bool(self.store.exec("callback_ended", callback_id=callback_id, state=state,
                                    error=error, now=now))

    def next_deadline(self) -> float | None:
        return _at(self.store.one("next_callback_deadline"))

    def run_ends_recorded(self, run_id: str) -> int:
        row = self.store.one("run_ends_recorded", run_id=run_id)
        return int(row["n"]) if row else 0

    def of_run(self, run_id: str) -> list[CallbackRecord]:
        return _records(self.store.rows("run_callbacks", run_id=run_id))

    def failures(self) -> dict[str, int]:
        """Failed callbacks by kind."""
        return {row["kind"]: int(row["n"]) for row in self.store.rows("callback_failures")}


def _records(rows: list[Any]) -> list[CallbackRecord]:
    return [CallbackRecord.from_row(row) for row in rows]


def _at(row: Any) -> float | None:
    return None if row is None or row["at"] is None else float(row["at"])
