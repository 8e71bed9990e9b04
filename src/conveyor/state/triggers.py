"""Deferred task instances and their triggers (sql/*.sql, migration_0018): what the
scheduler records when a task defers and reads when it is due again, and what a triggerer
claims, renews and fires. Every write is one UPDATE guarded by owner, attempt and state:
a trigger fires once however many triggerers ran it, and a task resumes once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from conveyor.state.records import TaskInstance, Transition
from conveyor.state.store import Repository


@dataclass(frozen=True)
class Deferral:
    """A deferred attempt's trigger, as the triggerer runs it."""

    ti_id: str
    attempt: int
    run_id: str
    classpath: str
    kwargs: dict[str, Any]
    timeout_at: float | None


@dataclass(frozen=True)
class TriggerState:
    """Where a deferred attempt's trigger is: fired (with its payload), failed (`payload`
    is the error, unfired), or still waiting."""

    classpath: str
    timeout_at: float | None
    fired: bool
    payload: str | None


class Triggers(Repository):
    """The scheduler's side (defer, look, resume, forget) and the triggerer's (claim,
    renew, fire, release)."""

    # -- the scheduler ----------------------------------------------------------------------

    def defer(self, step: Transition, *, run_id: str, classpath: str, kwargs: dict[str, Any],
              timeout_at: float | None) -> bool:
        """The attempt leaves its slot, its trigger recorded; False if it had moved on."""
        if not self.store.exec("ti_defer", ti_id=step.ti_id, attempt=step.attempt,
                               timeout_at=timeout_at):
            return False
        self.store.exec("insert_trigger", ti_id=step.ti_id, attempt=step.attempt,
                        run_id=run_id, classpath=classpath, kwargs=json.dumps(kwargs),
                        timeout_at=timeout_at, now=step.now)
        return True

    def state(self, ti_id: str, attempt: int) -> TriggerState | None:
        row = self.store.one("trigger_of", ti_id=ti_id, attempt=attempt)
        if row is None:
            return None
        return TriggerState(row["classpath"], row["timeout_at"], row["fired_at"] is not None,
                            row["payload"])

    def fired(self, limit: int) -> list[tuple[TaskInstance, str | None]]:
        """Deferred attempts whose trigger fired, oldest firing first, with its payload."""
        return [(TaskInstance.from_row(row), row["fired_payload"])
                for row in self.store.rows("fired_deferred", limit=limit)]

    def resume(self, ti: TaskInstance, payload: str | None, *, now: float, scheduler: str,
               lease: float) -> list[TaskInstance]:
        """The same attempt queued again with the payload, claimed for publishing."""
        rows = self.store.rows("ti_resume", ti_id=ti.ti_id, attempt=ti.attempt, now=now,
                               payload=payload, scheduler=scheduler, lease=lease)
        self.forget(ti.ti_id)
        return [TaskInstance.from_row(row) for row in rows]

    def forget(self, ti_id: str) -> None:
        self.store.exec("forget_trigger", ti_id=ti_id)

    # -- a triggerer ------------------------------------------------------------------------

    def claim(self, owner: str, *, now: float, lease: float, limit: int) -> list[Deferral]:
        """Unfired triggers nobody holds, now ours for `lease` seconds."""
        with self.store.transaction():
            rows = self.store.rows("claim_triggers", owner=owner, now=now, lease=lease,
                                   limit=limit)
        return [Deferral(row["ti_id"], int(row["attempt"]), row["run_id"], row["classpath"],
                         json.loads(row["kwargs"]), row["timeout_at"]) for row in rows]

    def renew(self, owner: str, *, now: float, lease: float) -> set[tuple[str, int]]:
        """Our lease renewed; the (ti_id, attempt) we still hold."""
        with self.store.transaction():
            rows = self.store.rows("renew_triggers", owner=owner, now=now, lease=lease)
        return {(row["ti_id"], int(row["attempt"])) for row in rows}

    def fire(self, owner: str, fired: list[tuple[Deferral, Any]], *, now: float
             ) -> list[Deferral]:
        """Record each trigger fired with its payload and make its task due, one
        transaction for the batch (each run locked first, as the scheduler's transactions
        do); those we fired (not one another triggerer took, nor one gone meanwhile)."""
        done: list[Deferral] = []
        with self.store.transaction():
            for deferral, payload in sorted(fired, key=lambda f: f[0].run_id):
                self.store.one("lock_run", run_id=deferral.run_id)
                if self.store.exec("fire_trigger", ti_id=deferral.ti_id,
                                   attempt=deferral.attempt, owner=owner, now=now,
                                   payload=json.dumps(payload, default=repr)):
                    self.store.exec("ti_trigger_fired", ti_id=deferral.ti_id,
                                    attempt=deferral.attempt, now=now)
                    done.append(deferral)
        return done

    def failed(self, owner: str, deferral: Deferral, error: str, *, now: float) -> None:
        """Its trigger raised: the task is due, to fail with `error`."""
        with self.store.transaction():
            self.store.one("lock_run", run_id=deferral.run_id)
            if self.store.exec("trigger_failed", ti_id=deferral.ti_id,
                               attempt=deferral.attempt, owner=owner, error=error):
                self.store.exec("ti_trigger_fired", ti_id=deferral.ti_id,
                                attempt=deferral.attempt, now=now)

    def release(self, owner: str) -> None:
        """What we hold, for another triggerer at once (we are stopping)."""
        with self.store.transaction():
            self.store.exec("release_triggers", owner=owner)

    def counts(self, now: float) -> dict[str, int]:
        """Deferred triggers in all, held by a live triggerer, fired (not yet resumed)."""
        row = self.store.one("trigger_counts", now=now) or {}
        return {k: int(row.get(k) or 0) for k in ("deferred", "running", "fired")}
