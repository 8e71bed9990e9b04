"""Firing callbacks: recorded with the transition that fires them, then sent like a task.

A task's `on_success` / `on_failure` / `on_retry` / `on_cancel` (and a DAG's, when a run
ends; and a deadline's, when a run misses it) is a registered task. Firing one is two steps,
as publishing an attempt is:

1. `record_*`, inside the transaction of the guarded transition that fires it: a row of
   `conveyor_callbacks`, unique per (task instance, attempt, kind) or (run, kind, how many
   times it ended: a run reopened by `tasks clear` ends again), holding the task to send,
   where, and its context (one dict argument), claimed by this scheduler.
   The transition happens once (its UPDATE is guarded), and the row's key holds even so: at
   most once per transition, however many schedulers apply the same events.
2. `Sender.flush`, after the commit: the rows this scheduler claimed are handed to their
   executor and marked published. A scheduler killed in between leaves them claimed; once
   its lease lapses any scheduler's tick claims and publishes them (`Sender.tick`): at least
   once. A callback recorded without a scheduler (`runs cancel`) is claimed by the next tick.

The callback's own outcome comes back as events on the scheduler's events queue (header
`callback`): a failure is logged and recorded (`conveyor_callback_failures_total` counts
them), and never changes the task or the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conveyor.events import Event
from conveyor.message import Message, new_id
from conveyor.scheduler.alerts import DEADLINE
from conveyor.scheduler.event_facts import FAILED, describe, worker_keeps
from conveyor.scheduler.executors import Executor, Workload
from conveyor.state.callbacks import Callbacks, RunAlerts
from conveyor.state.records import CallbackRecord, TaskInstance
from conveyor.state.store import Store

log = logging.getLogger("conveyor.scheduler.callbacks")

#: The header that marks a message (and its events) as a callback's: its callback id.
HEADER = "callback"
#: Callbacks published per query.
BATCH = 200
#: What ends a run in each state fires, of the DAG's callbacks.
RUN_KINDS = {"success": "on_success", "failed": "on_failure", "cancelled": "on_cancel"}


def error_facts(outcome: str, error: str, facts: Mapping[str, Any] | None) -> dict[str, str]:
    """The error a callback is told about: the worker's type, message and traceback when
    it sent them, else the scheduler's own words (a timeout: its outcome and reason)."""
    if facts and facts.get("type"):
        return {"type": str(facts.get("type", "")), "message": str(facts.get("message", "")),
                "traceback": str(facts.get("traceback", ""))}
    return {"type": outcome, "message": error.split("\n", 1)[0], "traceback": ""}


def record_task(store: Store, ti: TaskInstance, attempt: int, kind: str, now: float, *,
                outcome: str = "", error: str = "", facts: Mapping[str, Any] | None = None,
                scheduler: str = "", lease: float = 0.0) -> bool:
    """Record `ti`'s callback for `kind` if its spec has one (in the caller's transaction,
    the transition's); False if it has none or this one was recorded already."""
    spec = ti.spec.get("callbacks", {}).get(kind)
    if not spec:
        return False
    context: dict[str, Any] = {
        "kind": kind, "dag_id": ti.spec.get("dag_id", ""), "run_id": ti.run_id,
        "task_id": ti.task_id, "ti_id": ti.ti_id, "attempt": attempt,
        "logical_date": ti.spec.get("logical_date", ""), "state": _TI_STATES.get(kind, kind),
        "error": error_facts(outcome, error, facts) if outcome or error else None}
    map_index = getattr(ti, "map_index", None)
    if map_index is not None:
        context["map_index"] = map_index
    return Callbacks(store).record(
        callback_id=new_id(now), run_id=ti.run_id, ti_id=ti.ti_id, attempt=attempt, kind=kind,
        task=spec["task"], executor=ti.executor, queue=spec.get("queue") or ti.queue,
        context=json.dumps(context), scheduler=scheduler, lease=lease, now=now)


_TI_STATES = {"on_success": "success", "on_failure": "failed", "on_retry": "up_for_retry",
              "on_cancel": "cancelled"}


def record_run(store: Store, run: RunAlerts, kind: str, now: float, *, scheduler: str = "",
               lease: float = 0.0) -> bool:
    """Record the run's DAG-level callback for `kind` (or its deadline's: `DEADLINE`), sent
    to the default executor; False if it has none or it was recorded already."""
    alerts = json.loads(run.alerts or "{}")
    spec = (alerts.get("deadline") or {}).get("callback") if kind == DEADLINE else (
        alerts.get(kind))
    if not spec:
        return False
    context = {"kind": kind, "dag_id": run.dag_id, "run_id": run.run_id,
               "logical_date": run.logical_date, "state": run.state,
               "deadline_at": run.deadline_at, "deadline_missed_at": run.deadline_missed_at}
    # a run's own callbacks are keyed by how many times it ended (the caller holds its lock):
    # a run reopened by `tasks clear` that ends again fires again; its deadline, once
    table = Callbacks(store)
    ends = 0 if kind == DEADLINE else table.run_ends_recorded(run.run_id) + 1
    return table.record(
        callback_id=new_id(now), run_id=run.run_id, ti_id="", attempt=ends, kind=kind,
        task=spec["task"], executor="", queue=spec.get("queue") or "default",
        context=json.dumps(context), scheduler=scheduler, lease=lease, now=now)


def run_ended(store: Store, run_id: str, state: str, now: float, *, scheduler: str = "",
              lease: float = 0.0) -> bool:
    """Record the DAG-level callback of a run that just ended `state` (caller's
    transaction)."""
    kind = RUN_KINDS.get(state)
    run = Callbacks(store).run_alerts(run_id) if kind else None
    if kind is None or run is None or not run.alerts:
        return False
    return record_run(store, run, kind, now, scheduler=scheduler, lease=lease)


def message(record: CallbackRecord, events_queue: str) -> Message:
    """The message that runs a callback: its task, with the context as its one argument;
    outcomes reported to `events_queue`, never retried or dead-lettered by the worker."""
    return Message(
        id=record.callback_id, queue=record.queue, task=record.task,
        args=(json.loads(record.context),), max_retries=0, reply_to=events_queue,
        run_id=f"{HEADER}/{record.callback_id}", trace_id=record.run_id,
        headers={HEADER: record.callback_id, "settle": "report", "run": record.run_id,
                 "callback_kind": record.kind})


class Sender:
    """One scheduler's side of callbacks: records with its claim, publishes after commits,
    takes over what dead schedulers recorded, and applies callbacks' outcomes."""

    def __init__(self, store: Store, executors: Mapping[str, Executor], *,
                 events_queue: str, scheduler_id: str, lease: float) -> None:
        self.store = store
        self.table = Callbacks(store)
        self.executors = executors
        self.events_queue = events_queue
        self.scheduler_id = scheduler_id
        self.lease = lease
        #: Called with the callbacks about to be published: where a crash leaves them
        #: recorded and unpublished (tests kill the scheduler there).
        self.before_publish: Callable[[Sequence[CallbackRecord]], None] = lambda records: None
        self._unflushed = False

    @property
    def _claim(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler_id, "lease": self.lease}

    def task(self, ti: TaskInstance, attempt: int, kind: str, now: float, *,
             outcome: str = "", error: str = "",
             facts: Mapping[str, Any] | None = None) -> None:
        """A task instance's transition (in its transaction) that may fire a callback."""
        if ti.spec.get("callbacks") and record_task(
                self.store, ti, attempt, kind, now, outcome=outcome, error=error,
                facts=facts, **self._claim):
            self._unflushed = True

    def run_ended(self, run_id: str, state: str, now: float) -> None:
        """A run that ended (in its transaction) may fire its DAG's callback."""
        if run_ended(self.store, run_id, state, now, **self._claim):
            self._unflushed = True

    def deadline_missed(self, run: RunAlerts, now: float) -> None:
        if record_run(self.store, run, DEADLINE, now, **self._claim):
            self._unflushed = True

    def flush(self, now: float) -> None:
        """Publish what this scheduler recorded (after its transactions committed)."""
        while self._unflushed:   # one read: no transaction to open (and commit) for it
            records = self.table.claimed(self.scheduler_id, BATCH)
            self._unflushed = len(records) == BATCH
            self.publish(records, now)

    def tick(self, now: float) -> None:
        """Publish callbacks whose claimer died before publishing them, then ours."""
        while True:
            with self.store.transaction():
                records = self.table.claim_lapsed(now=now, limit=BATCH, **self._claim)
            for record in records:
                log.warning("callback %s (%s of run %s) was recorded by scheduler %s, which "
                            "died before publishing it: publishing it now", record.callback_id,
                            record.kind, record.run_id, record.claimed_by or "(none)")
            self.publish(records, now)
            if len(records) < BATCH:
                break
        self.flush(now)

    def next_due(self) -> float | None:
        return self.table.next_deadline()

    def publish(self, records: Sequence[CallbackRecord], now: float) -> None:
        """Hand callbacks to their executors (a batch each) and record the publish; one an
        executor refuses is recorded failed, with the executor's reason."""
        if not records:
            return
        self.before_publish(records)
        default = next(iter(self.executors), "")
        batches: dict[str, list[tuple[CallbackRecord, Workload]]] = {}
        for record in records:
            work = Workload(message(record, self.events_queue))
            batches.setdefault(record.executor or default, []).append((record, work))
        refused: dict[str, str] = {}
        for name, batch in batches.items():
            executor = self.executors.get(name)
            if executor is None:
                refused |= {r.callback_id: f"executor {name!r} is not configured on this "
                            f"scheduler" for r, _ in batch}
                continue
            by_work = {id(work): record for record, work in batch}
            for work, exc in executor.submit_many([work for _, work in batch]):
                refused[by_work[id(work)].callback_id] = str(exc)
        with self.store.transaction():
            for record in records:
                if record.callback_id in refused:
                    what = f"{record.task} {record.kind} of run {record.run_id}"
                    self._failed(record.callback_id, what,
                                 f"not sent: {refused[record.callback_id]}", now)
                else:
                    self.table.published(record.callback_id, now)

    def take(self, events: Sequence[Event], now: float) -> list[Event]:
        """Apply the callbacks' own events among `events`; the others, for the engine."""
        mine = [e for e in events if e.headers.get(HEADER)]
        if not mine:
            return list(events)
        with self.store.transaction():
            for event in mine:
                self._outcome(event, now)
        return [e for e in events if not e.headers.get(HEADER)]

    def _outcome(self, event: Event, now: float) -> None:
        callback_id = event.headers[HEADER]
        if event.kind == "succeeded":
            self.table.ended(callback_id, state="succeeded", error=None, now=now)
        elif (event.kind in FAILED or event.kind in ("expired", "cancelled")
              ) and not worker_keeps(event):
            what = (f"{event.task} {event.headers.get('callback_kind', '?')} of run "
                    f"{event.headers.get('run', '?')}")
            self._failed(callback_id, what, describe(event), now)

    def _failed(self, callback_id: str, what: str, error: str, now: float) -> None:
        """Record a callback failed (once) and say so; `what`: its task, kind and run."""
        if self.table.ended(callback_id, state="failed", error=error, now=now):
            log.warning("callback %s (%s) failed: %s; the run and its tasks are not "
                        "affected", callback_id, what, error.split("\n", 1)[0])
