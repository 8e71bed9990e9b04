"""The state machine: steps that take `now`, change the store, and hand work to executors.

Two entry points, both safe to run in several schedulers at once and to repeat:

* `handle(event, now)`: apply a worker's (or executor's) event to its task instance. The
  transition is one UPDATE guarded by the expected state and the attempt, made while the
  run's row is locked, so readiness of children is judged on a consistent view of the run.
  A success dispatches the children it made ready at once.
* `tick(now)`: everything time decides: cron runs, queued runs to start, retries that are
  due, queued and heartbeat timeouts, publishes never confirmed. Returns when it must run
  again, so the daemon sleeps until then (or until an event comes).

The engine never reads the clock and never sleeps; `daemon.py` is the loop around it.

Task-instance states: pending -> queued -> running -> success | up_for_retry | failed;
up_for_retry -> queued (attempt + 1); pending -> upstream_failed when a parent fails for good.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from conveyor import tracing
from conveyor.events import Event
from conveyor.flow import LIMITS_HEADER
from conveyor.message import Message
from conveyor.retry import backoff_delay
from conveyor.scheduler import cron
from conveyor.scheduler.dag import DAG, UPSTREAM_REF
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Workload, event_for
from conveyor.scheduler.operations import record_dag
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Row, Store

log = logging.getLogger("conveyor.scheduler")

EVENTS_QUEUE = "conveyor.scheduler.events"
#: Kinds that end an attempt badly; the scheduler retries it while the budget lasts.
FAILED = frozenset({"failed", "oom_killed", "timed_out", "dead_lettered"})
#: A publish not confirmed after this long is redone (the dispatching scheduler died).
PUBLISH_GRACE = 60.0
BATCH = 200


def task_ref(event: Event) -> tuple[str, int] | None:
    """(task-instance id, attempt) of an event, from its headers or its run id."""
    ti, attempt = event.headers.get("ti", ""), event.headers.get("attempt", "")
    if ti and attempt.isdigit():
        return ti, int(attempt)
    ti, _, attempt = event.run_id.rpartition("/")
    return (ti, int(attempt)) if ti and attempt.isdigit() else None


def by_run(events: Sequence[Event]) -> list[list[Event]]:
    """`events` grouped by the run they name (the worker copies the message's `run` header),
    each group in arrival order, groups in order of their first event. An event naming no
    run is a group of its own."""
    groups: dict[str, list[Event]] = {}
    for i, event in enumerate(events):
        groups.setdefault(event.headers.get("run") or f"#{i}", []).append(event)
    return list(groups.values())


def describe(event: Event) -> str:
    """What went wrong, one summary line first, then the traceback if there is one."""
    parts = [event.kind, event.error.get("type", ""), event.error.get("message", "")]
    summary = ": ".join(p for p in parts if p)
    if event.reason and event.reason not in summary:
        summary += f" ({event.reason})"
    traceback = event.error.get("traceback", "")
    return summary + (f"\n{traceback}" if traceback else "")


def workload(ti: Row, events_queue: str, upstream: Mapping[str, Any] | None = None
             ) -> Workload:
    """The message that runs this attempt of `ti`, and its executor config; `upstream`
    (what its parents returned) fills TaskFlow arguments and the task's context."""
    spec = json.loads(ti["spec"])
    ref = {"ti": ti["ti_id"], "attempt": str(ti["attempt"])}
    if spec.get("conf"):
        ref["conf"] = json.dumps(spec["conf"])
    if spec.get("dag_id"):
        ref["dag"] = spec["dag_id"]
    if spec.get("logical_date"):
        ref["logical_date"] = spec["logical_date"]
    if upstream:
        ref["upstream"] = json.dumps(upstream)
    if spec.get("limits"):
        ref[LIMITS_HEADER] = spec["limits"]
    if tracing.current() is not None:   # the attempt's span, child of the run's: see tracing
        ref[tracing.TRACEPARENT] = tracing.traceparent(
            *tracing.task_instance_ids(ti["run_id"], ti["ti_id"], ti["attempt"]))
    values = upstream or {}
    message = Message(
        queue=ti["queue"], task=spec["task"], command=tuple(spec["command"]),
        args=tuple(resolved(a, values) for a in spec["args"]),
        kwargs={k: resolved(v, values) for k, v in spec["kwargs"].items()},
        priority=ti["priority"],
        attempt=ti["attempt"], time_limit=spec["time_limit"],
        memory_limit=spec["memory_limit"], max_retries=0, reply_to=events_queue,
        run_id=f"{ti['ti_id']}/{ti['attempt']}", trace_id=ti["run_id"],
        headers={**ref, "settle": "report", "run": ti["run_id"], "task_id": ti["task_id"]})
    return Workload(message, spec.get("executor_config", {}))


def resolved(value: Any, upstream: Mapping[str, Any]) -> Any:
    """A spec argument with an upstream reference replaced by that task's return value."""
    if isinstance(value, dict) and len(value) == 1 and UPSTREAM_REF in value:
        return upstream.get(value[UPSTREAM_REF])
    return value


class Engine:
    """Applies events and timers to the store; see the module docstring."""

    def __init__(self, store: Store, executors: Mapping[str, Executor], *,
                 dags: Mapping[str, DAG] | None = None, events_queue: str = EVENTS_QUEUE,
                 publish_grace: float = PUBLISH_GRACE) -> None:
        self.store = store
        self.executors = dict(executors)
        self.dags = dict(dags or {})
        self.events_queue = events_queue
        self.publish_grace = publish_grace
        #: Called with each new deadline written, so the daemon can wake for it.
        self.on_deadline: Callable[[float], None] = lambda at: None
        #: Called with (the outcome's timestamp, children dispatched) after an event made
        #: tasks ready: the DAG hop, for metrics.
        self.on_dispatched: Callable[[float, int], None] = lambda at, n: None
        self.runs_finished = 0
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
        success without its children published."""
        for group in by_run(events):
            with self.store.transaction():
                made = self._apply_group(group, now)
            self._dispatch([ti for _, ready in made for ti in ready], now)
            for event, ready in made:
                if ready:
                    self.on_dispatched(event.at, len(ready))

    def _apply_group(self, group: Sequence[Event], now: float) -> list[tuple[Event, list[Row]]]:
        """Apply one run's events in the caller's transaction: their task instances read
        (and the run locked) in one query, and whether the run ended asked once, after the
        last event (a batch of 100 successes asks once, not 100 times). What is read of a
        task instance here does not change within an attempt; its state is guarded in SQL."""
        refs = [task_ref(event) for event in group]
        ids = sorted({ref[0] for ref in refs if ref is not None})
        tis = {ti["ti_id"]: ti for ti in self.store.rows("tis_locking_run",
                                                         ti_ids=json.dumps(ids))} if ids else {}
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

    def _apply_event(self, event: Event, ref: tuple[str, int] | None, tis: Mapping[str, Row],
                     now: float) -> list[Row]:
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

    def _apply(self, ti: Row, attempt: int, event: Event, now: float) -> list[Row]:
        kind = event.kind
        key = {"ti_id": ti["ti_id"], "attempt": attempt, "at": event.at, "now": now}
        # the worker kept the message (requeued at shutdown, or retrying it itself)
        worker_keeps = kind in ("interrupted", "retried") or (
            kind in FAILED and kind != "dead_lettered" and event.retry_in > 0)
        if kind == "succeeded":
            return self._succeeded(ti, {**key, **what_is_known(event)}, now, event.result,
                                   output(event))
        if worker_keeps:          # same attempt, back to queued
            self._note(now + ti["queued_timeout"])
            self.store.exec("ti_requeued", error=describe(event), **key)
        elif kind in FAILED:
            self._attempt_failed(ti, key, kind, describe(event), now, output(event))
        elif kind == "started":
            self._note(now + ti["heartbeat_timeout"])
            if not self.store.exec("ti_started", hostname=event.hostname, pid=event.pid, **key):
                self._started_late(event, key)
        elif kind == "heartbeat":
            self.store.exec("ti_heartbeat", **key)
        elif kind == "parked":    # waiting for a slot of its pool or limit: no timeout
            self.store.exec("ti_parked", **key)
        elif kind == "unparked":  # handed a slot and queued again: the timeout runs again
            self._note(now + ti["queued_timeout"])
            self.store.exec("ti_unparked", **key)
        return []

    def _started_late(self, event: Event, key: dict[str, Any]) -> None:
        """A `started` that comes after the outcome fills in what the outcome left blank."""
        known = {**key, **what_is_known(event), "at": event.at}
        if self.store.exec("ti_started_late", **known):
            self.store.exec("attempt_started_late", **known)

    def _succeeded(self, ti: Row, key: dict[str, Any], now: float, value: Any,
                   log: str | None = None) -> list[Row]:
        """Success, with the value the task returned kept in the run (for its children,
        `tasks show`, and a restarted scheduler), in the same transaction."""
        result = json.dumps(value)
        if not self.store.exec("ti_succeeded", result=result, **key):
            return []
        self.store.exec("record_attempt", outcome="succeeded", error=None, result=result,
                        log=log, **key)
        _trace_attempt(ti, key["attempt"], "success", now)
        ready = [] if json.loads(ti["spec"]).get("downstream") == [] else self.store.rows(
            "dispatch_children", run_id=ti["run_id"], now=now, task_id=ti["task_id"],
            publish_grace=self.publish_grace)   # no query for a task with no children
        self._finish(ti["run_id"], now)
        return ready

    def _attempt_failed(self, ti: Row, key: dict[str, Any], outcome: str, error: str,
                        now: float, log: str | None = None) -> None:
        """Up for retry while attempts remain (backoff from retry.py), else failed for good."""
        record = {"outcome": outcome, "error": error, "result": None, "log": log, **key}
        if key["attempt"] < ti["max_attempts"]:
            due = now + retry_delay(key["attempt"], json.loads(ti["spec"]))
            if self.store.exec("ti_up_for_retry", error=error, next_retry_at=due, **key):
                self.store.exec("record_attempt", **record)
                _trace_attempt(ti, key["attempt"], outcome, now, error)
                self._note(due)
            return
        if self.store.exec("ti_failed", error=error, **key):
            self.store.exec("record_attempt", **record)
            _trace_attempt(ti, key["attempt"], outcome, now, error)
            self.store.exec("upstream_failed", run_id=ti["run_id"], task_id=ti["task_id"],
                            now=now)
            self._finish(ti["run_id"], now)

    def _finish(self, run_id: str, now: float) -> None:
        """End the run if nothing in it is left to do (in a batch: once, at its end)."""
        if self._finishing is not None:
            self._finishing.add(run_id)
            return
        finished = self.store.one("finish_run", run_id=run_id, now=now)
        if finished:
            self.runs_finished += 1
            log.info("run %s ended %s", run_id, finished["state"])
            tracer = tracing.current()
            if tracer is not None:
                tracer.dag_run(run_id, finished["dag_id"], start=finished["created_at"],
                               end=now, state=finished["state"])

    # -- timers ---------------------------------------------------------------------------------

    def tick(self, now: float) -> float | None:
        """Do everything due at `now`; return when something is next due (None: nothing)."""
        self._cron(now)
        for row in self.store.rows("due", now=now, limit=BATCH):
            self._expire(row, now)
        self._claim_and_dispatch("start_queued_runs", now)
        self._claim_and_dispatch("claim_due_retries", now)
        return self.next_due(now)

    def next_due(self, now: float) -> float | None:
        """The earliest deadline or cron tick this scheduler acts on."""
        found = self.store.one("next_deadline")
        times = [found["at"]] if found and found["at"] is not None else []
        times += [row["next_tick"] for row in self.store.rows("dags")
                  if row["dag_id"] in self.dags and row["next_tick"] is not None
                  and row["dag_id"] not in self._capped]
        return min(times, default=None)

    def _cron(self, now: float) -> None:
        """Create the runs of every scheduled DAG whose ticks passed: each missed tick with
        `catchup` (up to `max_active_runs` at once; the rest when runs end), else the
        latest only. A paused DAG's ticks pass without runs."""
        self._capped.clear()
        for row in self.store.rows("dags"):
            dag = self.dags.get(row["dag_id"])
            if dag is None or not dag.schedule or not row["next_tick"] or row["next_tick"] > now:
                continue
            if dag.catchup and not row.get("paused"):
                self._catch_up(dag, row["next_tick"], now)
                continue
            logical = max(row["next_tick"], cron.latest_tick(dag.schedule, now, dag.timezone))
            following = cron.next_tick(dag.schedule, now, dag.timezone)
            with self.store.transaction():
                if self.store.exec("advance_tick", dag_id=dag.dag_id, next_tick=following,
                                   expected=row["next_tick"]) and not row.get("paused"):
                    create_run(self.store, dag, now, executors=list(self.executors),
                               logical_date=logical, run_type="scheduled")

    def _catch_up(self, dag: DAG, tick: float, now: float) -> None:
        """One run per tick from `tick` to `now`, oldest first, while the DAG has fewer than
        `max_active_runs` queued or running; each advance is guarded, so two schedulers
        never create the same tick twice (and the unique logical date holds anyway)."""
        assert dag.schedule is not None
        while tick <= now:
            active = self.store.one("dag_active_runs", dag_id=dag.dag_id)
            if active and active["n"] >= dag.max_active_runs:
                self._capped.add(dag.dag_id)      # resumes when one of its runs ends
                return
            following = cron.next_tick(dag.schedule, tick, dag.timezone)
            with self.store.transaction():
                if not self.store.exec("advance_tick", dag_id=dag.dag_id, next_tick=following,
                                       expected=tick):
                    return                        # another scheduler moved it
                create_run(self.store, dag, now, executors=list(self.executors),
                           logical_date=tick, run_type="scheduled")
            tick = following

    def _claim_and_dispatch(self, claim: str, now: float) -> None:
        """Start queued runs, or re-queue due retries, a batch at a time."""
        while True:
            with self.store.transaction():
                claimed = self.store.rows(claim, now=now, limit=BATCH,
                                          publish_grace=self.publish_grace)
                ready = claimed
                if claim == "start_queued_runs":   # a started run dispatches its roots
                    ready = [ti for run in claimed for ti in self._start(run["run_id"], now)]
            self._dispatch(ready, now)
            if len(claimed) < BATCH:
                return

    def _start(self, run_id: str, now: float) -> list[Row]:
        """The task instances a run just started can dispatch; a run with none and nothing
        unfinished (one reopened by `tasks mark`) ends here."""
        ready = self.store.rows("dispatch_ready", run_id=run_id, now=now,
                                publish_grace=self.publish_grace)
        if not ready:
            self._finish(run_id, now)
        return ready

    def _expire(self, due: Row, now: float) -> None:
        """A queued or running task instance whose deadline passed (checked again under the
        run lock: an event may have moved it meanwhile)."""
        with self.store.transaction():
            self.store.exec("lock_run", run_id=due["run_id"])
            ti = self.store.one("still_due", ti_id=due["ti_id"], attempt=due["attempt"],
                                state=due["state"], now=now)
            republish: list[Row] = []
            if ti is not None and ti["state"] == "queued" and ti["published_at"] is None:
                republish = self.store.rows("claim_unpublished", ti_id=ti["ti_id"], now=now,
                                            attempt=ti["attempt"],
                                            publish_grace=self.publish_grace)
            elif ti is not None:
                outcome, error = timeout_reason(ti, now)
                key = {"ti_id": ti["ti_id"], "attempt": ti["attempt"], "at": now, "now": now}
                self._attempt_failed(ti, key, outcome, error, now)
        self._dispatch(republish, now)

    # -- dispatch -------------------------------------------------------------------------------

    def _dispatch(self, tis: Sequence[Row], now: float) -> None:
        """Hand the newly queued task instances to their executors (a batch each), then
        record the publish; one an executor refuses fails with the executor's reason."""
        batches: dict[str, list[tuple[Row, Workload]]] = {}
        for ti in sorted(tis, key=lambda t: (-t["priority"], t["position"])):
            work = workload(ti, self.events_queue, self._upstream_results(ti))
            batches.setdefault(ti["executor"], []).append((ti, work))
        published: list[Row] = []
        for name, batch in batches.items():
            refused = self._submit(name, [work for _, work in batch])
            published += [ti for ti, work in batch if id(work) not in refused]
            for work, exc in refused.values():
                self.handle(event_for(work.message, "failed", reason=str(exc), error={
                    "type": "ExecutorError", "message": str(exc)}), now)
        if published:
            with self.store.transaction():
                # runs first, as every transaction here does: updating these rows without
                # their run's lock could deadlock with another scheduler's batch of events
                # holding the lock and one of them (found by the two-scheduler test)
                for run_id in sorted({ti["run_id"] for ti in published}):
                    self.store.exec("lock_run", run_id=run_id)
                self.store.exec_many("mark_published", [
                    {"ti_id": ti["ti_id"], "attempt": ti["attempt"], "now": now}
                    for ti in published])
            self._note(now + min(ti["queued_timeout"] for ti in published))

    def _submit(self, name: str, works: list[Workload]
                ) -> dict[int, tuple[Workload, ExecutorError]]:
        """Submit `works` to executor `name`; those refused, by `id()` of the workload."""
        executor = self.executors.get(name)
        if executor is None:
            exc = ExecutorError(f"executor {name!r} is not configured on this scheduler (it "
                                f"has {', '.join(self.executors)})")
            return {id(work): (work, exc) for work in works}
        return {id(work): (work, exc) for work, exc in executor.submit_many(works)}

    def _upstream_results(self, ti: Row) -> dict[str, Any]:
        """What the task's parents returned (no query for a task without parents)."""
        if not json.loads(ti["spec"]).get("upstream"):
            return {}
        rows = self.store.rows("upstream_results", run_id=ti["run_id"], task_id=ti["task_id"])
        return {r["task_id"]: json.loads(r["result"]) if r["result"] else None for r in rows}

    def _note(self, deadline: float) -> None:
        self.on_deadline(deadline)


def _trace_attempt(ti: Row, attempt: int, outcome: str, now: float, error: str = "") -> None:
    """The span of an attempt that ended (while tracing is on): from queued to `now`."""
    tracer = tracing.current()
    if tracer is not None:
        name = f"{json.loads(ti['spec']).get('dag_id', '')}.{ti['task_id']}".lstrip(".")
        tracer.task_instance(ti["run_id"], ti["ti_id"], attempt, name, start=ti["queued_at"],
                             end=now, outcome=outcome, error=error)


def what_is_known(event: Event) -> dict[str, Any]:
    """Where and when the attempt ran, as far as `event` says (None: it does not say)."""
    return {"hostname": event.hostname or None, "pid": event.pid or None,
            "started": event.started_at or None}


def output(event: Event) -> str | None:
    """The attempt's last lines of output as stored with it (JSON), None when it sent none."""
    return json.dumps(list(event.log)) if event.log else None


def retry_delay(attempt: int, spec: Mapping[str, Any]) -> float:
    """Seconds before retry number `attempt`: `retry.backoff_delay` with the task's base
    delay, cap and jitter."""
    base = float(spec["retry_delay"])
    if base <= 0:
        return 0.0
    return backoff_delay(attempt, base, spec["retry_max_delay"], spec["retry_jitter"])


def timeout_reason(ti: Row, now: float) -> tuple[str, str]:
    """(outcome, error) for a task instance whose queued or heartbeat deadline passed."""
    if ti["state"] == "queued":
        waited = now - (now if ti["queued_at"] is None else ti["queued_at"])
        return "queued_timeout", (
            f"queued_timeout: queued for {waited:.0f} s on {ti['executor']} "
            f"(queue {ti['queue']!r}) without starting (limit {ti['queued_timeout']:g} s): "
            "are workers consuming that queue, with free slots?")
    last = ti["heartbeat_at"] if ti["heartbeat_at"] is not None else ti["started_at"]
    silent = now - (now if last is None else last)
    where = f"{ti['hostname'] or '?'} pid {ti['pid'] or '?'}"
    return "heartbeat_timeout", (
        f"heartbeat_timeout: no heartbeat for {silent:.0f} s from the attempt running on "
        f"{where} (limit {ti['heartbeat_timeout']:g} s): the worker died or hung")
