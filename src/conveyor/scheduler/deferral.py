"""Deferred attempts as the engine sees them: a `deferred` event recorded with its trigger
(the attempt leaves its slot: state `deferred`, due at its timeout), and a deferred attempt
that became due: its trigger fired (a triggerer made it due), so the same attempt is queued
again, a new segment, with the payload in its context; or its timeout passed (failed
`timed_out`, retried while attempts remain, like any timeout); or its trigger raised in a
triggerer (failed with that error). The triggerer's side is conveyor/triggerer; the
store's, state/triggers.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.events import Event
from conveyor.state.records import TaskInstance, Transition
from conveyor.state.runs import Runs
from conveyor.state.store import Store
from conveyor.state.triggers import Triggers

#: The engine's `_attempt_failed(ti, key, outcome, error, now)`: the children made ready
Fail = Callable[[TaskInstance, Transition, str, str, float], list[TaskInstance]]


def record(store: Store, ti: TaskInstance, key: Transition, event: Event,
           wake_at: Callable[[float], None]) -> None:
    """The attempt deferred on the trigger its event carries (`runner._deferral`): recorded
    in the caller's transaction; its timeout counts from when the task deferred."""
    deferral = event.result if isinstance(event.result, dict) else {}
    timeout = deferral.get("timeout")
    timeout_at = None if timeout is None else event.at + float(timeout)
    if Triggers(store).defer(key, run_id=ti.run_id, classpath=str(deferral.get("classpath")),
                             kwargs=dict(deferral.get("kwargs") or {}),
                             timeout_at=timeout_at) and timeout_at is not None:
        wake_at(timeout_at)


def resume_fired(store: Store, now: float, claim: dict[str, Any], limit: int = 200
                 ) -> tuple[int, list[TaskInstance]]:
    """Every deferred attempt whose trigger fired (up to `limit`: the engine's BATCH, which
    its `_claim_and_dispatch` repeats while a batch comes back full), queued again in the
    caller's transaction, runs locked in order: 200 files landing at once are one
    transaction and one publish batch, not 200 of each. (How many were found, those
    resumed: another scheduler may have resumed some.)"""
    triggers, runs = Triggers(store), Runs(store)
    fired = triggers.fired(limit)
    for run_id in sorted({ti.run_id for ti, _ in fired}):
        runs.lock(run_id)
    resumed = [again for ti, payload in fired
               for again in triggers.resume(ti, payload, now=now, **claim)]
    return len(fired), resumed


def due(store: Store, ti: TaskInstance, now: float, claim: dict[str, Any], fail: Fail
        ) -> list[TaskInstance]:
    """A deferred attempt whose deadline came (the caller holds its run's lock): resumed if
    its trigger fired, else failed; the task instances to dispatch."""
    triggers = Triggers(store)
    trigger = triggers.state(ti.ti_id, ti.attempt)
    if trigger is not None and trigger.fired:
        return triggers.resume(ti, trigger.payload, now=now, **claim)
    triggers.forget(ti.ti_id)
    key = Transition(ti.ti_id, ti.attempt, now, now)
    what = trigger.classpath.rpartition(":")[2] if trigger else "its trigger"
    if trigger is not None and trigger.payload is not None:   # it raised in a triggerer
        return fail(ti, key, "failed", f"failed: deferred on {what}: {trigger.payload}", now)
    return fail(ti, key, "timed_out", f"timed_out: deferred on {what}, which did not fire by "
                                      f"its timeout (Defer's timeout)", now)
