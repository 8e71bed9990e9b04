"""The state machine: steps that take `now`, change the store, and hand work to executors.

Two entry points, both safe to run in several schedulers at once and to repeat:

* `handle(event, now)`: apply a worker's (or executor's) event to its task instance. The
  transition is one UPDATE guarded by the expected state and the attempt, made while the
  run's row is locked, so readiness of children is judged on a consistent view of the run.
  A success dispatches the children it made ready at once.
* `tick(now)`: everything time decides: cron runs, queued runs to start, retries that are
  due, queued and heartbeat timeouts, attempts a dead scheduler claimed and never
  published. Returns when it must run again, so the daemon sleeps until then (or until an
  event comes).

The engine never reads the clock and never sleeps; `daemon.py` is the loop around it.

Task-instance states: pending -> queued -> running -> success | up_for_retry | failed | cancelled
| deferred (deferral.py); up_for_retry -> queued (attempt + 1); pending -> queued, skipped or
upstream_failed as its trigger rule and any branch above it say, judged whenever a parent ends
(`readiness.py`, `rules.py`). A `cancelled` attempt (its worker stopped it, or refused it unrun:
`Client.cancel` of the attempt, conveyor/control) is terminal and never retried; its run ends
failed, unless it was cancelled as a whole (`operations.cancel_run`): cancelled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from conveyor import tracing
from conveyor.events import Event
from conveyor.kinds import pinned_queue
from conveyor.message import new_id
from conveyor.scheduler import cron, deadlines, deferral
from conveyor.scheduler import event_facts as facts_of
from conveyor.scheduler.asset_runs import AssetRuns
from conveyor.scheduler.branches import choice_problem
from conveyor.scheduler.callbacks import Sender
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.event_facts import FAILED, describe, output, what_is_known, worker_keeps
from conveyor.scheduler.executors import Executor, Workload, event_for
from conveyor.scheduler.mapping import MAX_MAP_LENGTH, Mapper
from conveyor.scheduler.operations import record_dag
from conveyor.scheduler.pinning import Held, Pins, holding_tis
from conveyor.scheduler.readiness import Readiness
from conveyor.scheduler.runs import create_run
from conveyor.scheduler.timeouts import retry_delay, timeout_reason
from conveyor.scheduler.workloads import workload
from conveyor.state.records import Due, TaskInstance, Transition
from conveyor.state.runs import Dags, Runs
from conveyor.state.store import Store, through_losses
from conveyor.state.tasks import Attempts, TaskInstances

log = logging.getLogger("conveyor.scheduler")

EVENTS_QUEUE = "conveyor.scheduler.events"
#: Seconds a scheduler's lease lasts (renewed a third of it apart while it lives): the
#: attempts a killed scheduler claimed and never published are published by another one
#: this soon after its death. The daemon uses its event lease (CONVEYOR_SCHEDULER_EVENT_LEASE).
LEASE = 5.0
#: Seconds past an attempt's deadline to start (its message's `expires`) before the
#: scheduler times it out: the clocks of worker and scheduler may disagree, and a `started`
#: sent just before the deadline takes a moment to arrive. Within it, a worker that starts
#: the attempt is heard of before the timeout; past it, no worker starts it.
START_GRACE = 5.0
BATCH = 200


class Engine:
    """Applies events and timers to the store; see the module docstring."""

    def __init__(self, store: Store, executors: Mapping[str, Executor], *,
                 dags: Mapping[str, DAG] | None = None, events_queue: str = EVENTS_QUEUE,
                 scheduler_id: str = "", lease: float = LEASE,
                 start_grace: float = START_GRACE,
                 max_map_length: int = MAX_MAP_LENGTH) -> None:
        self.store = store
        self.runs, self.tis, self.attempts = Runs(store), TaskInstances(store), Attempts(store)
        self.readiness = Readiness(self.tis)
        #: the DAGs as the store recorded them (`dags` is what this scheduler loaded)
        self.recorded = Dags(store)
        self.executors = dict(executors)
        self.dags = dict(dags or {})
        self.events_queue = events_queue
        #: Who claims attempts for publishing: a live scheduler keeps its lease under this id
        #: (scheduler/lease.py); an engine without one is never waited for.
        self.scheduler_id = scheduler_id or f"engine-{new_id()}"
        self.lease = lease
        self.start_grace = start_grace
        self.mapper = Mapper(store, lambda: self._claim, self.readiness, max_map_length)
        self.pins = Pins(store)   # where runs pinned to their code send their tasks
        #: Runs of DAGs scheduled on assets and events, from their queued events
        self.asset_runs = AssetRuns(store)
        #: Tasks made ready by a mapped task's end, dispatched with the caller's batch
        self._later: list[TaskInstance] = []
        #: Called with the task instances just claimed, before they are handed to their
        #: executors: the one point where a crash leaves claims unpublished (tests use it).
        self.before_publish: Callable[[Sequence[TaskInstance]], None] = lambda tis: None
        #: Called with each new deadline written, so the daemon can wake for it.
        self.on_deadline: Callable[[float], None] = lambda at: None
        #: Called with (the outcome's timestamp, children dispatched) after an event made
        #: tasks ready: the DAG hop, for metrics.
        self.on_dispatched: Callable[[float, int], None] = lambda at, n: None
        self.runs_finished = 0
        #: Records callbacks with their transitions and publishes them (callbacks.py)
        self.callbacks = Sender(store, self.executors, events_queue=events_queue,
                                scheduler_id=self.scheduler_id, lease=lease)
        #: DAGs whose catch-up waits for one of their runs to end (not a deadline to wake for)
        self._capped: set[str] = set()
        #: Runs to try to end once their batch of events is applied (None: outside a batch)
        self._finishing: set[str] | None = None

    # -- DAGs -----------------------------------------------------------------------------------

    def sync_dags(self, now: float) -> None:
        """Record the loaded DAGs (version, file, schedule, first cron tick) in the store."""
        with self.store.transaction():
            for dag in self.dags.values():
                record_dag(self.store, dag, now)

    def use_dags(self, dags: Mapping[str, DAG], changed: Iterable[str], now: float) -> None:
        """Schedule `dags` from now on (hot reload), recording those in `changed`. A DAG no
        longer there gets no new runs; its runs in progress finish (a run is a snapshot)."""
        self.dags = dict(dags)
        with self.store.transaction():
            for dag_id in sorted(changed):
                if dag_id in self.dags:
                    record_dag(self.store, self.dags[dag_id], now)

    # -- events ---------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> None:
        """Apply one event; a duplicate, late or foreign event changes nothing."""
        self.handle_many([event], now)

    def handle_many(self, events: Sequence[Event], now: float) -> None:
        """Apply `events` in order: one transaction per run, then that run's ready children
        published in one batch. Why a transaction per run and not per event: each commit
        costs a flush to disk on Postgres (~3 ms here), which bounded a scheduler to a few
        hundred events a second; why not one for all: a transaction that holds one run's
        lock at a time, as a single event's does, can never deadlock with another scheduler.
        A run applied is dispatched before the next is tried, so an error leaves no applied
        success without its children published. Callbacks' own events are theirs."""
        for group in facts_of.by_run(self.callbacks.take(events, now)):
            self._later = []   # what a rolled-back transaction left is not ready
            with self.store.transaction():
                made = self._apply_group(group, now)
            self._dispatch([ti for _, ready in made for ti in ready] + self._take_later(), now)
            for event, ready in made:
                if ready:
                    self.on_dispatched(event.at, len(ready))
        self.callbacks.flush(now)

    def _apply_group(self, group: Sequence[Event], now: float
                     ) -> list[tuple[Event, list[TaskInstance]]]:
        """Apply one run's events in the caller's transaction: their task instances read
        (and the run locked) in one query, and whether the run ended asked once, after the
        last event (a batch of 100 successes asks once, not 100 times). What is read of a
        task instance here does not change within an attempt; its state is guarded in SQL."""
        refs = [facts_of.task_ref(event) for event in group]
        ids = sorted({ref[0] for ref in refs if ref is not None})
        tis = self.tis.locking_runs(ids)
        self._finishing = set()
        try:
            made = [(event, self._apply_event(event, ref, tis, now))
                    for event, ref in zip(group, refs, strict=True)]
            finishing, self._finishing = self._finishing, None
            for run_id in sorted(finishing):
                self._finish(run_id, now)
        finally:
            self._finishing = None
        return made

    def _apply_event(self, event: Event, ref: tuple[str, int] | None,
                     tis: Mapping[str, TaskInstance], now: float) -> list[TaskInstance]:
        """Apply one event inside the caller's transaction; the task instances it made ready."""
        if ref is None:
            log.warning("event %s of message %s names no task instance: not the "
                        "scheduler's, ignored", event.kind, event.message_id)
            return []
        ti = tis.get(ref[0])
        if ti is None:
            log.warning("event %s for unknown task instance %s: ignored", event.kind, ref[0])
            return []
        return self._apply(ti, ref[1], event, now)

    def _apply(self, ti: TaskInstance, attempt: int, event: Event, now: float
               ) -> list[TaskInstance]:
        kind = event.kind
        key = Transition(ti.ti_id, attempt, event.at, now)
        if kind == "succeeded":
            return self._succeeded(ti, key, event, output(event))
        if kind == "skipped":     # it raised Skip (or exited with a skip code): not retried
            return self._skipped(ti, key, event, output(event))
        if kind == "deferred":    # it raised Defer: its slot is free, a triggerer waits
            deferral.record(self.store, ti, key, event, self._note)
        elif kind in ("started", "heartbeat", "parked", "unparked"):
            self._progressed(ti, key, event, now)
        elif worker_keeps(event):  # same attempt, back to queued, with a fresh deadline to start
            self._note(now + ti.queued_timeout + self.start_grace)
            self.tis.requeued(key, error=describe(event), start_grace=self.start_grace)
        elif kind in FAILED:
            return self._attempt_failed(ti, key, kind, describe(event), now, output(event),
                                        event.error)
        elif kind == "expired":   # a worker acked it unrun: past its deadline to start
            return self._expired(ti, key, event, now)
        elif kind == "cancelled":  # stopped, or acked unrun: never retried
            return self._cancelled(ti, key, describe(event), now, output(event), event.error)
        return []

    def _progressed(self, ti: TaskInstance, key: Transition, event: Event, now: float) -> None:
        """An attempt that goes on: started, beating, waiting for a slot, or given one."""
        if event.kind == "started":
            self._note(now + ti.heartbeat_timeout)
            self.pins.started(ti, event)
            if not self.tis.started(key, hostname=event.hostname, pid=event.pid):
                self._started_late(event, key)
        elif event.kind == "heartbeat":
            self.tis.heartbeat(key)
        elif event.kind == "parked":    # waiting for a slot of its pool or limit: no timeout
            self.tis.parked(key)
        else:                     # handed a slot and queued again: the timeout runs again
            self._note(now + ti.queued_timeout + self.start_grace)
            self.tis.unparked(key, start_grace=self.start_grace)

    def _expired(self, ti: TaskInstance, key: Transition, event: Event, now: float
                 ) -> list[TaskInstance]:
        """A copy of the attempt's message was acked unrun; what to publish again, if any.

        If the attempt never started, that is its queued timeout, heard before the
        scheduler's own timer. If it started and this copy was delivered before (the
        started one came back from a worker that lost it: killed, or its lease lapsed), the
        same attempt is published again with a fresh deadline, as the redelivery would have
        run it. A first delivery of a running attempt is a second publish of it: the run in
        progress goes on, and its heartbeats decide."""
        current = self.tis.get(ti.ti_id)   # an earlier event may have moved it
        if current is None or current.attempt != key.attempt:
            return []
        if current.state == "queued":
            return self._attempt_failed(ti, key, "queued_timeout", f"queued_timeout: "
                                        f"{event.reason} (refused by {event.hostname or '?'})",
                                        now)
        elif current.state == "running" and event.delivery > 1:
            log.warning("attempt %d of %s came back from the worker running it (delivery %d) "
                        "after its deadline to start: publishing it again", key.attempt,
                        ti.ti_id, event.delivery)
            return self.tis.reissue(ti_id=ti.ti_id, attempt=key.attempt, now=now,
                                    **self._claim)
        elif current.state == "running":
            log.info("a second copy of attempt %d of %s expired on %s while the attempt runs: "
                     "ignored", key.attempt, ti.ti_id, event.hostname or "?")
        return []

    def _started_late(self, event: Event, key: Transition) -> None:
        """A `started` that comes after the outcome fills in what the outcome left blank.
        One for an attempt timed out before it started breaks the promise that such an
        attempt never runs: only clocks further apart than the start grace can do that."""
        known = what_is_known(event)
        if self.attempts.outcome(key.ti_id, key.attempt) == "queued_timeout":
            log.error("attempt %d of task instance %s STARTED on %s (pid %s) at %.3f after it "
                      "was timed out for not starting: the worker's clock is behind the "
                      "scheduler's by more than the start grace (%g s, "
                      "CONVEYOR_SCHEDULER_START_GRACE), or its `started` took that long to "
                      "arrive. Check the hosts' clocks (NTP)", key.attempt, key.ti_id,
                      event.hostname or "?", event.pid or "?", event.at, self.start_grace)
        where = {"hostname": known["hostname"], "pid": known["pid"]}
        if self.tis.started_late(key, **where):
            self.attempts.started_late(key, **where)

    def _succeeded(self, ti: TaskInstance, key: Transition, event: Event,
                   log: str | None = None) -> list[TaskInstance]:
        """Success, with the value the task returned kept in the run (for its children,
        `tasks show`, and a restarted scheduler), in the same transaction."""
        children = ti.spec.get("downstream")
        if "branch" in ti.spec and (why := choice_problem(event.result, ti.task_id,
                                                          children or [])):
            return self._attempt_failed(ti, key, "failed", f"BranchError: {why}", key.now, log)
        result = json.dumps(event.result)
        if not self.tis.succeeded(key, result=result, **what_is_known(event)):
            return []
        self.attempts.record(key, outcome="succeeded", error=None, result=result, log=log)
        if ti.spec.get("outlets"):   # its asset events commit with its success; tick soon
            self.asset_runs.produced(ti, event.result, event.asset_extra, key.now)
            self._note(key.now)
        facts_of.trace_attempt(ti, key.attempt, "success", key.now)
        self.callbacks.task(ti, key.attempt, "on_success", key.now)
        ready = [] if children == [] else self.mapper.expand(self.readiness.after(
            ti.run_id, [ti.task_id], key.now, claim=self._claim), key.now)  # none: no query
        self._finish(ti.run_id, key.now)
        return ready

    def _skipped(self, ti: TaskInstance, key: Transition, event: Event,
                 log: str | None = None) -> list[TaskInstance]:
        """It skipped itself (Skip, a skip exit code): as if a rule had skipped it, its
        children judged by their rules; no callback (Airflow's do not fire on a skip)."""
        why = event.reason or "skipped by the task"
        if not self.tis.skipped(key, reason=why, **what_is_known(event)):
            return []
        self.attempts.record(key, outcome="skipped", error=why, result=None, log=log)
        facts_of.trace_attempt(ti, key.attempt, "skipped", key.now)
        return self._ended(ti, key.now)

    def _attempt_failed(self, ti: TaskInstance, key: Transition, outcome: str, error: str,
                        now: float, log: str | None = None,
                        facts: Mapping[str, Any] | None = None) -> list[TaskInstance]:
        """Up for retry while attempts remain (backoff from retry.py), else failed for good:
        then its children follow their trigger rules; those that became ready. `facts`: the
        worker's error (type, message, traceback), for callbacks."""
        told: dict[str, Any] = {"outcome": outcome, "error": error, "facts": facts}
        if key.attempt < ti.max_attempts:
            due = now + retry_delay(key.attempt, ti.spec)
            if self.tis.up_for_retry(key, error=error, next_retry_at=due):
                self.attempts.record(key, outcome=outcome, error=error, result=None, log=log)
                facts_of.trace_attempt(ti, key.attempt, outcome, now, error)
                self.callbacks.task(ti, key.attempt, "on_retry", now, **told)
                self._note(due)
            return []
        if not self.tis.failed(key, error=error):
            return []
        self.attempts.record(key, outcome=outcome, error=error, result=None, log=log)
        facts_of.trace_attempt(ti, key.attempt, outcome, now, error)
        self.callbacks.task(ti, key.attempt, "on_failure", now, **told)
        return self._ended(ti, now)

    def _cancelled(self, ti: TaskInstance, key: Transition, error: str, now: float,
                   log: str | None = None, facts: Mapping[str, Any] | None = None
                   ) -> list[TaskInstance]:
        """A cancelled attempt: terminal, counted as a failure by the trigger rules below
        it, and the run ended if nothing else is left."""
        if ti.state not in ("queued", "running") or not self.tis.cancelled(key, error=error):
            return []
        self.attempts.record(key, outcome="cancelled", error=error, result=None, log=log)
        facts_of.trace_attempt(ti, key.attempt, "cancelled", now, error)
        self.callbacks.task(ti, key.attempt, "on_cancel", now, outcome="cancelled",
                            error=error, facts=facts)
        return self._ended(ti, now)

    def _ended(self, ti: TaskInstance, now: float) -> list[TaskInstance]:
        """A task that ended without success: what its children's rules make of it (an
        `all_done` cleanup starts, an `all_success` child is upstream_failed)."""
        ready = [] if ti.spec.get("downstream") == [] else self.mapper.expand(
            self.readiness.after(ti.run_id, [ti.task_id], now, claim=self._claim), now)
        self._finish(ti.run_id, now)
        return ready

    def _finish(self, run_id: str, now: float) -> None:
        """End the run if nothing in it is left to do (in a batch: once, at its end)."""
        if self._finishing is not None:
            self._finishing.add(run_id)
            return
        self._later += self.mapper.close(run_id, now)   # mapped tasks whose instances ended
        finished = self.runs.finish(run_id, now)
        if finished:
            self.runs_finished += 1
            log.info("run %s ended %s", run_id, finished.state)
            self.callbacks.run_ended(run_id, finished.state, now)
            tracer = tracing.current()
            if tracer is not None:
                tracer.dag_run(run_id, finished.dag_id, start=finished.created_at,
                               end=now, state=finished.state)

    # -- timers ---------------------------------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Do everything due at `now`; return when something is next due (None: nothing)."""
        self._cron(now)
        self.asset_runs.tick(self.dags, list(self.executors), now)
        self._claim_and_dispatch(lambda at: deferral.resume_fired(self.store, at, self._claim), now)
        for due in self.tis.due(now, BATCH):
            self._expire(due, now)
        self._claim_and_dispatch(self._start_queued_runs, now)
        self._claim_and_dispatch(self._claim_due_retries, now)
        deadlines.fire_due(self.store, self.callbacks, now)
        self.callbacks.tick(now)
        return self.next_due(now)

    def next_due(self, now: float) -> float | None:
        """The earliest deadline (of a task, a callback's publish, a run) or cron tick."""
        times = [at for at in (self.tis.next_deadline(), self.callbacks.next_due(),
                               deadlines.next_due(self.store)) if at is not None]
        times += [dag.next_tick for dag in self.recorded.all()
                  if dag.dag_id in self.dags and dag.next_tick is not None
                  and dag.dag_id not in self._capped]
        return min(times, default=None)

    def _cron(self, now: float) -> None:
        """Create the runs of every scheduled DAG whose ticks passed: each missed tick with
        `catchup` (up to `max_active_runs` at once; the rest when runs end), else the
        latest only. A paused DAG's ticks pass without runs."""
        self._capped.clear()
        for recorded in self.recorded.all():
            dag = self.dags.get(recorded.dag_id)
            tick = recorded.next_tick
            if dag is None or not dag.schedule or not tick or tick > now:
                continue
            if dag.catchup and not recorded.paused:
                self._catch_up(dag, tick, now)
                continue
            logical = max(tick, cron.latest_tick(dag.schedule, now, dag.timezone))
            following = cron.next_tick(dag.schedule, now, dag.timezone)
            with self.store.transaction():
                if self.recorded.advance_tick(dag_id=dag.dag_id, next_tick=following,
                                              expected=tick) and not recorded.paused:
                    create_run(self.store, dag, now, executors=list(self.executors),
                               logical_date=logical, run_type="scheduled")

    def _catch_up(self, dag: DAG, tick: float, now: float) -> None:
        """One run per tick from `tick` to `now`, oldest first, while the DAG has fewer than
        `max_active_runs` queued or running; each advance is guarded, so two schedulers
        never create the same tick twice (and the unique logical date holds anyway)."""
        assert dag.schedule is not None
        while tick <= now:
            if self.recorded.active_runs(dag.dag_id) >= dag.max_active_runs:
                self._capped.add(dag.dag_id)      # resumes when one of its runs ends
                return
            following = cron.next_tick(dag.schedule, tick, dag.timezone)
            with self.store.transaction():
                if not self.recorded.advance_tick(dag_id=dag.dag_id, next_tick=following,
                                                  expected=tick):
                    return                        # another scheduler moved it
                create_run(self.store, dag, now, executors=list(self.executors),
                           logical_date=tick, run_type="scheduled")
            tick = following

    def _claim_and_dispatch(self, claim: Callable[[float], tuple[int, list[TaskInstance]]],
                            now: float) -> None:
        """Start queued runs, or re-queue due retries, a batch at a time: `claim(now)` says
        how many it claimed, and the task instances to dispatch."""
        while True:
            self._later = []
            with self.store.transaction():
                claimed, ready = claim(now)
            self._dispatch(ready + self._take_later(), now)
            if claimed < BATCH:
                return

    def _start_queued_runs(self, now: float) -> tuple[int, list[TaskInstance]]:
        """A batch of queued runs started, and their roots (a started run dispatches them)."""
        started = self.runs.start_queued(now=now, limit=BATCH)
        return len(started), [ti for run_id in started for ti in self._start(run_id, now)]

    def _claim_due_retries(self, now: float) -> tuple[int, list[TaskInstance]]:
        ready = self.tis.claim_due_retries(now=now, limit=BATCH, **self._claim)
        return len(ready), ready

    def _start(self, run_id: str, now: float) -> list[TaskInstance]:
        """The task instances a run just started can dispatch; a run with none and nothing
        unfinished (one reopened by `tasks mark`) ends here."""
        ready = self.mapper.expand(self.readiness.whole_run(run_id, now, claim=self._claim),
                                   now)
        if not ready:
            self._finish(run_id, now)
        return ready

    def _expire(self, due: Due, now: float) -> None:
        """A queued or running task instance whose deadline passed (checked again under the
        run lock: an event may have moved it meanwhile)."""
        self._later = []
        with self.store.transaction():
            self.runs.lock(due.run_id)
            ti = self.tis.still_due(due, now)
            republish: list[TaskInstance] = []
            timed_out: TaskInstance | None = None
            if ti is not None and ti.state == "queued" and ti.published_at is None:
                republish = self._claim_unpublished(ti, now)
            elif ti is not None and ti.state == "deferred":   # its trigger fired, or timed out
                republish = deferral.due(self.store, ti, now, self._claim, self._attempt_failed)
            elif ti is not None and (version := self.pins.stranded(ti, now)):
                republish = self._send_again(ti, version, now)
            elif ti is not None:
                outcome, error = timeout_reason(ti, now, self.start_grace)
                key = Transition(ti.ti_id, ti.attempt, now, now)
                republish = self._attempt_failed(ti, key, outcome, error, now)  # children
                timed_out = ti if outcome == "queued_timeout" else None
        self._dispatch(republish + self._take_later(), now)
        if timed_out is not None:
            self._withdraw(timed_out)

    def _send_again(self, ti: TaskInstance, version: str, now: float) -> list[TaskInstance]:
        """A pinned attempt stranded in `<queue>@<version>` (no live worker of it left) past
        its deadline to start: recorded as `stranded` and sent again as the next attempt,
        uncharged (pinning.py). Its message can no longer run: a worker acks it unrun."""
        key = Transition(ti.ti_id, ti.attempt, now, now)
        error = (f"stranded: sent to {pinned_queue(ti.queue, version)}, whose workers (code "
                 f"version {version}) are all gone; sent again")
        self.attempts.record(key, outcome="stranded", error=error, result=None, log=None)
        again = self.tis.send_again(ti_id=ti.ti_id, attempt=ti.attempt, now=now, **self._claim)
        if again:
            log.warning("task %s of run %s: attempt %d %s as attempt %d", ti.task_id,
                        ti.run_id, ti.attempt, error, ti.attempt + 1)
        return again

    @property
    def _claim(self) -> dict[str, Any]:
        """What every claim for publishing records: who claimed, and when to look again."""
        return {"scheduler": self.scheduler_id, "lease": self.lease}

    def _claim_unpublished(self, ti: TaskInstance, now: float) -> list[TaskInstance]:
        """A queued attempt whose publish was never recorded: ours to publish if its claimer
        is dead (its lease lapsed); else looked at again when the claimer's lease would
        lapse. The caller holds the run's lock, which the claimer's `mark_published` takes."""
        claimed = self.tis.claim_unpublished(ti_id=ti.ti_id, attempt=ti.attempt, now=now,
                                             **self._claim)
        if claimed and ti.claimed_by != self.scheduler_id:
            log.warning("task instance %s attempt %d was claimed by scheduler %s, which died "
                        "before publishing it: publishing it now", ti.ti_id, ti.attempt,
                        ti.claimed_by or "?")
        elif claimed and ti.waiting_for is None:
            log.warning("task instance %s attempt %d: our claim of it committed though the "
                        "store's session was lost (a failover); publishing it now",
                        ti.ti_id, ti.attempt)
        elif not claimed:
            self.tis.wait_for_claimer(ti_id=ti.ti_id, attempt=ti.attempt, now=now)
        return claimed

    def _withdraw(self, ti: TaskInstance) -> None:
        """Tell the attempt's executor it was timed out before it started (see
        `Executor.withdraw`); if it cannot take it back, say so: its outcome is ignored."""
        executor = self.executors.get(ti.executor)
        if executor is None:
            return
        try:
            executor.withdraw(ti.ti_id, ti.attempt)
        except ExecutorError as exc:
            log.warning("attempt %d of %s timed out but was not withdrawn: %s; if it starts, "
                        "its outcome is ignored", ti.attempt, ti.ti_id, exc)

    # -- dispatch -------------------------------------------------------------------------------

    def _dispatch(self, tis: Sequence[TaskInstance], now: float) -> None:
        """Hand the newly queued task instances to their executors (a batch each), then
        record the publish; one an executor refuses fails with the executor's reason. A
        pinned run's task goes where `pins` says, or is held (pinning.py)."""
        batches: dict[str, list[tuple[TaskInstance, Workload]]] = {}
        routes, held = self.pins.route(tis, now)
        holding = {h.ti.ti_id for h in held}
        for ti in sorted(tis, key=lambda t: (-t.priority, t.position)):
            if ti.ti_id not in holding:
                version = routes.get(ti.ti_id)
                work = workload(ti, self.events_queue, self._upstream_results(ti), now=now,
                                queue=pinned_queue(ti.queue, version) if version else None)
                batches.setdefault(ti.executor, []).append((ti, work))
        if tis:
            self.before_publish(tis)
        published: list[TaskInstance] = []
        for name, batch in batches.items():
            refused = self._submit(name, [work for _, work in batch])
            published += [ti for ti, work in batch if id(work) not in refused]
            for work, exc in refused.values():
                self.handle(event_for(work.message, "failed", reason=str(exc), error={
                    "type": "ExecutorError", "message": str(exc)}), now)
        if published or held:
            # Recorded even through a lost store session (a failover): the messages are out,
            # and a claim of ours left unrecorded would be published again (_claim_unpublished)
            through_losses(f"recording {len(published)} task instances published",
                           lambda: self._record_published(published, held, now, routes))
        if published:
            self._note(now + min(ti.queued_timeout for ti in published) + self.start_grace)
        if held:
            self._note(min(h.recheck_at for h in held))

    def _record_published(self, published: list[TaskInstance], held: list[Held],
                          now: float, sent_to: Mapping[str, str]) -> None:
        with self.store.transaction():
            # runs first, as every transaction here does: updating these rows without their
            # run's lock could deadlock with another scheduler's batch of events holding the
            # lock and one of them (found by the two-scheduler test)
            for run_id in sorted({ti.run_id for ti in [*published, *holding_tis(held)]}):
                self.runs.lock(run_id)
            self.tis.mark_published(published, now=now, start_grace=self.start_grace,
                                    sent_to=sent_to)
            self.pins.hold(held)

    def _submit(self, name: str, works: list[Workload]
                ) -> dict[int, tuple[Workload, ExecutorError]]:
        """Submit `works` to executor `name`; those refused, by `id()` of the workload."""
        executor = self.executors.get(name)
        if executor is None:
            exc = ExecutorError(f"executor {name!r} is not configured on this scheduler (it "
                                f"has {', '.join(self.executors)})")
            return {id(work): (work, exc) for work in works}
        return {id(work): (work, exc) for work, exc in executor.submit_many(works)}

    def _upstream_results(self, ti: TaskInstance) -> dict[str, Any]:
        """What the task's parents returned (no query for a task without parents)."""
        if not ti.spec.get("upstream"):
            return {}
        found = self.tis.upstream_results(ti.run_id, ti.task_id)
        return {task_id: json.loads(result) if result else None
                for task_id, result in found.items()}

    def _take_later(self) -> list[TaskInstance]:
        later, self._later = self._later, []
        return later

    def _note(self, deadline: float) -> None:
        self.on_deadline(deadline)

