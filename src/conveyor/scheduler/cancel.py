"""Cancelling a DAG run, or one task of a run (`conveyor runs cancel RUN`, `conveyor tasks
cancel RUN TASK`, the dashboard's button and JSON API).

A task that has not ended becomes `cancelled` (terminal, never retried) in one transaction
with its run's row locked, as `operations.py` changes runs, so it never races an event a
scheduler is applying; what is below it follows its trigger rules (`cancelled` counts as a
failure: an all_success child is upstream_failed, an all_done one runs). A run
cancelled as a whole (`Runs.cancel`) has every unfinished task cancelled (pending ones never
start) and ends `cancelled` in that same transaction.

An attempt a worker may hold (queued or running) is also cancelled through `Client.cancel`
(handed in as `cancel`) by its attempt's id (`control.attempt_ref`), which every message of
the attempt carries: a worker never starts it, or stops it (--cancel-grace). That record is
written BEFORE the transaction, so a crash in between leaves a cancel that still stops the
work (the worker's `cancelled` event then ends the task through the engine); attempts that
became active meanwhile are cancelled after it. An outcome a worker reports later for an
attempt cancelled here changes nothing (every transition is guarded by the state it leaves).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from conveyor.control import CancelResult, attempt_ref
from conveyor.scheduler import callbacks
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.readiness import Readiness
from conveyor.state.maps import Maps
from conveyor.state.records import TaskInstance, Transition
from conveyor.state.runs import Runs
from conveyor.state.store import Store
from conveyor.state.tasks import Attempts, TaskInstances

#: States of a task instance whose attempt a worker may hold.
ACTIVE = ("queued", "running")
#: States of a task instance that has not ended.
OPEN = ("pending", *ACTIVE, "up_for_retry", "deferred")

#: `Client.cancel`: records a message (here an attempt's) id as cancelled.
Cancel = Callable[[str], object]


@dataclass(frozen=True)
class Outcome:
    """What a cancel did: `result` (cancelled; already_cancelled or finished: nothing
    changed), the state of the run or task before it, and the task ids it cancelled."""

    result: CancelResult
    was: str
    tasks: tuple[str, ...] = ()

    def doc(self) -> dict[str, object]:
        """For --json and the dashboard's API."""
        return {"result": self.result.value, "was": self.was, "cancelled": list(self.tasks)}

    def describe(self, what: str) -> str:
        """One line for people, about `what` ("run R", "T in run R")."""
        if self.result is CancelResult.CANCELLED:
            tasks = f": {', '.join(self.tasks)} cancelled" if len(self.tasks) > 1 else ""
            return f"{what} cancelled (was {self.was}){tasks}"
        if self.result is CancelResult.ALREADY_CANCELLED:
            return f"{what} was cancelled already: nothing changed"
        return f"{what} has finished already ({self.was}): nothing changed"


def cancel_run(store: Store, run_id: str, now: float, cancel: Cancel) -> Outcome:
    """Cancel every unfinished task of the run and end it `cancelled`."""
    run = Runs(store).get(run_id)
    if run is None:
        raise RunError(f"no run {run_id!r}: find it with `conveyor runs list`")
    if run.state not in ("queued", "running"):
        return Outcome(_ended(run.state), run.state)
    tis = TaskInstances(store)
    sent = _cancel_attempts(tis.of_run(run_id), cancel, set())
    with store.transaction():
        Runs(store).lock(run_id)
        found = tis.of_run(run_id)
        done = [ti.task_id for ti in found if _cancel_ti(store, ti, now, "cancelled with its "
                                                          "run (conveyor runs cancel)")]
        if not Runs(store).cancel(run_id, now):     # it ended, or was cancelled, meanwhile
            return Outcome(_ended(_state(store, run_id)), run.state)
        _finish(store, run_id, now)
    _cancel_attempts(found, cancel, sent)
    return Outcome(CancelResult.CANCELLED, run.state, tuple(done))


def cancel_task(store: Store, run_id: str, task_id: str, now: float,
                cancel: Cancel) -> Outcome:
    """Cancel one task of a run: what is below it follows its trigger rules (an all_success
    child is upstream_failed), and the run ends failed once nothing else is left. A mapped
    task's unfinished instances are cancelled with it."""
    tis = TaskInstances(store)
    ti = _task(tis, run_id, task_id)
    if ti.state not in OPEN:
        return Outcome(_ended(ti.state), ti.state)
    sent = _cancel_attempts([ti, *Maps(store).instances(run_id, task_id)], cancel, set())
    with store.transaction():
        Runs(store).lock(run_id)
        current = _task(tis, run_id, task_id)
        instances = Maps(store).instances(run_id, task_id)
        if not _cancel_ti(store, current, now, "cancelled (conveyor tasks cancel)"):
            return Outcome(_ended(current.state), ti.state)
        for instance in instances:
            _cancel_ti(store, instance, now, f"cancelled with {task_id} (conveyor tasks cancel)")
        below = Readiness(tis)     # the children's trigger rules count it a failure
        below.after(run_id, [task_id], now, claim=None)
        if below.left_ready:       # e.g. an all_done cleanup: the next tick dispatches it
            Runs(store).reopen(run_id)
        _finish(store, run_id, now)
    _cancel_attempts([current, *instances], cancel, sent)
    return Outcome(CancelResult.CANCELLED, ti.state, (task_id,))


def _cancel_ti(store: Store, ti: TaskInstance, now: float, error: str) -> bool:
    """Move an unfinished task instance to `cancelled` (the caller holds its run's lock);
    an attempt that was queued or running is recorded as ended `cancelled`."""
    if ti.state not in OPEN:
        return False
    step = Transition(ti.ti_id, ti.attempt, now, now)
    if not TaskInstances(store).cancelled(step, error=error):
        return False
    if ti.state in ACTIVE:
        Attempts(store).record(step, outcome="cancelled", error=error, result=None, log=None)
    callbacks.record_task(store, ti, ti.attempt, "on_cancel", now, outcome="cancelled",
                          error=error)   # published by a scheduler's next tick
    return True


def _finish(store: Store, run_id: str, now: float) -> None:
    """End the run if nothing is left, recording its DAG's callback (published by a
    scheduler's next tick)."""
    finished = Runs(store).finish(run_id, now)
    if finished is not None:
        callbacks.run_ended(store, run_id, finished.state, now)


def _cancel_attempts(tis: Iterable[TaskInstance], cancel: Cancel, sent: set[str]) -> set[str]:
    """`cancel` the attempts a worker may hold that are not in `sent`; all the refs sent."""
    refs = {attempt_ref(ti.ti_id, ti.attempt) for ti in tis
            if ti.state in ACTIVE and ti.map_count is None}   # a mapped task: its instances
    for ref in sorted(refs - sent):
        cancel(ref)
    return refs | sent


def _task(tis: TaskInstances, run_id: str, task_id: str) -> TaskInstance:
    ti = tis.by_task(run_id, task_id)
    if ti is None:
        raise RunError(f"no task {task_id!r} in run {run_id!r}: see the run's tasks with "
                       f"`conveyor runs show {run_id}`")
    return ti


def _state(store: Store, run_id: str) -> str:
    run = Runs(store).get(run_id)
    return "" if run is None else run.state


def _ended(state: str) -> CancelResult:
    return CancelResult.ALREADY_CANCELLED if state == "cancelled" else CancelResult.FINISHED
