"""The supervisor: the `conveyor worker` process.

It holds at most `concurrency` deliveries (so a long task never keeps short ones waiting in a
prefetch buffer; on RabbitMQ `--read-ahead` lets up to READ_AHEAD more wait in the
connection, handed out only when a slot frees), hands each to a runner forked ahead of need,
watches the runner (reports, exit status, cgroup OOM counter, time limits), and settles the
message only after the outcome event is published: ack, retry later with backoff, requeue,
or dead-letter.

Its main thread blocks on the broker; the pool's watcher thread wakes it (`broker.wakeup`)
when a runner finishes, and signal handlers do the same for SIGTERM/SIGINT. Everything
that touches the broker happens on the main thread.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any

from conveyor import tracing
from conveyor.broker import Broker, Delivery
from conveyor.errors import BrokerConnectionError, ConveyorError, LeaseLost, MessageError
from conveyor.events import Event
from conveyor.flow import LIMITS_HEADER, Spec, limits_of
from conveyor.limits import Limiter
from conveyor.message import Codec, Message
from conveyor.signals import SignalThread
from conveyor.tasks import REGISTRY
from conveyor.worker import cgroups
from conveyor.worker.flow import Gate
from conveyor.worker.isolation import scrub_environment
from conveyor.worker.metrics import Metrics
from conveyor.worker.outage import HeldSettles
from conveyor.worker.outcome import (
    Action,
    Budget,
    Facts,
    Outcome,
    classify,
    decide,
    over_delivery_cap,
)
from conveyor.worker.pool import Pool, Runner, Zygote
from conveyor.worker.results import ResultKeeper, wanted

log = logging.getLogger("conveyor.worker")
#: RabbitMQ deliveries a worker may hold beyond its slots by default (`--read-ahead`). On a
#: quorum queue the next push comes 1-1.3 ms after an ack (a Raft commit) and in bursts, so
#: a supervisor starting a short task every ~0.5 ms needs several at hand; with 1 its slots
#: waited for the broker 40% of the time (3 messages in flight), with 8 about 4%.
READ_AHEAD = 8


@dataclass(frozen=True)
class WorkerConfig:
    """Everything `conveyor worker` was told; see `conveyor.worker.cli` for the flags."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 2
    apps: tuple[str, ...] = ()
    memory_limit: int = 0
    max_tasks_per_child: int = 1
    read_ahead: int = READ_AHEAD  # see Broker.consume(ahead=...): RabbitMQ only
    time_limit: float = 0.0
    soft_time_limit: float = 0.0
    soft_grace: float = 10.0
    uid: int | None = None
    gid: int | None = None
    hostname: str = field(default_factory=socket.gethostname)
    heartbeat_interval: float = 10.0
    drain_timeout: float = 30.0
    burst: bool = False
    metrics_port: int = 0
    max_retries: int = 3
    max_deliveries: int = 20
    exit_after_outage: float = 0.0  # seconds the broker may stay away; 0: ride out any outage
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0


@dataclass(eq=False)
class Run:
    """One delivery this worker holds, from acceptance to settlement."""

    delivery: Delivery
    message: Message
    budget: Budget
    accepted: float = field(default_factory=time.monotonic)
    started: float = 0.0
    soft_at: float = math.inf
    hard_at: float = math.inf
    hard_timed_out: bool = False
    interrupted: bool = False
    runner: Runner | None = None
    limits: list[Spec] = field(default_factory=list)
    trace: Any = None  # its spans (a tracing.otel.Claim) while tracing is on

    @property
    def log_label(self) -> str:
        m = self.message
        return f"task={m.label} id={m.id} attempt={m.attempt}" + (
            f" run={m.run_id}" if m.run_id else "")


class Supervisor:
    def __init__(self, config: WorkerConfig, broker: Broker, codec: Codec,
                 metrics: Metrics | None = None, results: ResultKeeper | None = None,
                 limiter: Callable[[], Limiter] | None = None,
                 zygote: Zygote | None = None) -> None:
        self.config = config
        self.results = results
        self.broker = broker
        self.codec = codec
        self.metrics = metrics or Metrics()
        self.limiter = cgroups.detect()
        self.gate = Gate(limiter, broker, codec, self.metrics.limit_denied,
                         self.metrics.limits if self.metrics.wants_limits else None,
                         self._parked, self._unparked) if limiter is not None else None
        self.pending: deque[Run] = deque()
        #: deliveries a park batch claimed and left alone (worker/flow.py), handed to
        #: `_accept` before the broker's next; never more than the slots free at the time
        self.spare: deque[Delivery] = deque()
        self.held = HeldSettles(config.exit_after_outage)  # settles the broker could not take
        self.running: set[Run] = set()
        #: queue -> (succeeded, failed) tasks since start, for the heartbeat: replaced, never
        #: mutated, so the registry's thread can copy it while the main thread counts
        self.finished: dict[str, tuple[int, int]] = {}
        self.draining_since: float | None = None
        self.cold = False
        self._next_heartbeat = time.monotonic() + config.heartbeat_interval
        self._pool_changed = threading.Event()
        self._in_broker_wait = False
        self._signals: SignalThread | None = None  # acts on SIGTERM/SIGINT: conveyor.signals
        self._consuming = False
        self.pool = Pool(list(config.apps), scrub_environment(os.environ), self._on_pool_change,
                         self.limiter, config.max_tasks_per_child, config.uid, config.gid,
                         lanes=config.concurrency, zygote=zygote)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Consume until told to stop (or, with --burst, until the queues are empty)."""
        self._signals = SignalThread({signal.SIGTERM: self._on_stop_signal,
                                      signal.SIGINT: self._on_stop_signal})
        log.info("worker %s consuming %s with %d slots; memory caps: %s", self.config.hostname,
                 ",".join(self.config.queues), self.config.concurrency, self.limiter.describe())
        steps = self.broker.consume(list(self.config.queues), prefetch=self.config.concurrency,
                                    timeout=min(1.0, self.config.heartbeat_interval),
                                    ahead=self.config.read_ahead)
        try:
            while True:
                self.held.retry()
                delivery = self._next(steps)
                if self.pool.failure:
                    raise ConveyorError(f"worker stopping: {self.pool.failure}")
                if delivery is not None:
                    self._accept(delivery)
                self._settle_finished()
                self._start_pending()
                self._check_timers(time.monotonic())
                if self._done(delivery):
                    return 0
        finally:
            self._stop()

    def _next(self, steps: Generator[Delivery | None, float | None, None]) -> Delivery | None:
        """Block where the next thing will come from: the broker if a slot is free, else the
        runner pool. Waking the broker costs a round trip on some transports, so a full
        worker never waits there."""
        if self.draining_since is not None:
            self._give_back_spare("the worker is draining")
        if len(self.running) + len(self.pending) >= self.config.concurrency \
                or self.draining_since is not None:
            self._pool_changed.wait(timeout=min(1.0, self.config.heartbeat_interval))
            self._pool_changed.clear()
            return None
        if self.spare:
            return self.spare.popleft()
        self._in_broker_wait = True
        try:
            if not self._consuming:  # a generator's first step cannot take a value
                self._consuming = True
                return next(steps)
            return steps.send(0.0 if self._pool_changed.is_set() else None)
        finally:
            self._in_broker_wait = False
            self._pool_changed.clear()

    def _on_pool_change(self) -> None:
        """Called by the pool's watcher thread when a runner is ready or a run finished."""
        self._pool_changed.set()
        if self._in_broker_wait:
            self.broker.wakeup()

    def _done(self, last: Delivery | None) -> bool:
        if self.running:
            return False
        if self.draining_since is not None:
            return True  # what is pending or spare never started: `_stop` gives it back
        if self.pending or self.spare:
            return False
        if not self.config.burst or last is not None:
            return False
        # in flight elsewhere counts: a crashed worker's lease may expire into our hands
        return self.broker.is_empty(self.config.queues) \
            and (self.gate is None or self.gate.waiting() == 0)

    def _stop(self) -> None:
        self._give_back_spare("the worker stopped")
        for run in list(self.pending):
            self._settle(run, Action("requeue", reason="worker stopped"), None)
            self._release(run)
        if self.held:
            log.warning("stopping with %d settle(s) the broker never took: those messages are "
                        "delivered again", len(self.held))
        self.pool.close()
        self.limiter.close()
        if self._signals is not None:
            self._signals.close()
        if self.gate is not None:
            self.gate.close()
        self.broker.close()
        if self.results is not None:
            self.results.close()
        log.info("worker %s stopped", self.config.hostname)

    # -- accepting deliveries -------------------------------------------------------------

    def _accept(self, delivery: Delivery) -> None:
        """Decode and vet a delivery; bad input is dead-lettered at once, never retried."""
        try:
            message = self.codec.decode(delivery.body)
        except MessageError as exc:
            self._reject(delivery, f"bad message: {exc}")
            return
        budget = self._budget(message)
        why = self._unrunnable(delivery, message, budget)
        if why is not None:
            self._reject(delivery, why, message)
            return
        message = replace(message, deliveries=delivery.delivery_count)
        limits = self._limits_of(delivery, message)
        if limits is None:
            return
        run = Run(delivery, message, budget, limits=limits)
        tracer = tracing.current()
        if tracer is not None:
            run.trace = tracer.claimed(message, delivery.queue, self.config.hostname)
        self.pending.append(run)

    @staticmethod
    def _unrunnable(delivery: Delivery, message: Message, budget: Budget) -> str | None:
        """Why a readable delivery is dead-lettered before it runs (its delivery cap is
        spent, or no --app registers its task); None if it may run."""
        capped = over_delivery_cap(delivery.delivery_count, budget)
        if capped is not None:
            return capped.reason
        if message.task and message.task not in REGISTRY:
            return f"unknown task {message.task!r}: no module given with --app registers it"
        return None

    def _limits_of(self, delivery: Delivery, message: Message) -> list[Spec] | None:
        """The message's limits once admitted ([] when it has none); None when it was
        parked, delayed or rejected instead (see worker/flow.py)."""
        if LIMITS_HEADER not in message.headers:
            return []  # the unlimited path: the limiter's store is never touched
        try:
            specs = limits_of(message.headers)
        except (ValueError, KeyError, TypeError) as exc:
            self._reject(delivery, f"bad limits header: {exc}", message)
            return None
        if self.gate is None:
            log.warning("%s has limits but this worker has no limiter: running it unlimited",
                        message.id)
            return []
        try:
            verdict = self.gate.admit(delivery, message, specs)
        except LeaseLost as exc:
            log.warning("%s: %s", message.id, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - the limiter store's own errors
            log.error("could not admit %s through its limits (%s); it is given back",
                      message.id, exc)
            self.held.settle(f"giving back {message.id}",
                             lambda: self.broker.retry_later(delivery, 1.0))
            return None
        if verdict == "parked":
            self._park_behind()  # parked and acked: this delivery is settled
        return specs if verdict == "run" else None

    def _park_behind(self) -> None:
        """Its key is full: park what waits behind it in batches (worker/flow.py). Of the
        deliveries left alone, keep as many as there are free slots for `_accept`; give the
        rest back at once, so that an idle worker runs them instead of this one's queue."""
        assert self.gate is not None
        left = self.gate.park_behind(self.config.queues, self._parkable)
        free = self.config.concurrency - len(self.running) - len(self.pending) - len(self.spare)
        self.spare.extend(left[:max(free, 0)])
        for delivery in left[max(free, 0):]:
            self._give_back(delivery, "no free slot")

    def _parkable(self, delivery: Delivery) -> tuple[Message, list[Spec]] | None:
        """A delivery's message and limits if a park batch may park it; None for anything
        `_accept` must see (unreadable, unlimited, over its cap, an unknown task)."""
        try:
            message = self.codec.decode(delivery.body)
            specs = limits_of(message.headers)
        except (MessageError, ValueError, KeyError, TypeError):
            return None
        if not specs or self._unrunnable(delivery, message, self._budget(message)):
            return None
        return message, specs

    def _give_back_spare(self, why: str) -> None:
        while self.spare:
            self._give_back(self.spare.popleft(), why)

    def _give_back(self, delivery: Delivery, why: str) -> None:
        """Return an unstarted delivery to its queue, ready at once."""
        def op() -> None:
            try:
                self.broker.retry_later(delivery, 0.0)
            except LeaseLost:
                pass  # its lease lapsed: it is someone else's now
        self.held.settle(f"giving back a message of {delivery.queue} ({why})", op)

    def _parked(self, message: Message, queue: str, key: str) -> None:
        """Tell the message's reply_to that it waits for a slot of `key` (a scheduler then
        stops its queued timeout, as Airflow's does for a task waiting for a pool)."""
        self._tell("parked", message, queue, reason=f"waiting for a slot of {key}")

    def _unparked(self, body: bytes, queue: str) -> None:
        """Tell the reply_to of a message handed a slot that it is queued again."""
        try:
            message = self.codec.decode(body)
        except MessageError:
            return  # it was parked, so it was read once; a worker that claims it says more
        self._tell("unparked", message, queue)

    def _budget(self, message: Message) -> Budget:
        c = self.config
        task = REGISTRY.get(message.task)
        retries = message.max_retries if message.max_retries >= 0 else (
            task.options.max_retries if task else c.max_retries)
        backoff = task.options.retry_backoff if task else c.retry_backoff
        cap = task.options.retry_backoff_max if task else c.retry_backoff_max
        return Budget(retries, c.max_deliveries, backoff, cap)

    def _reject(self, delivery: Delivery, reason: str, message: Message | None = None) -> None:
        log.warning("dead-lettering a message from %s: %s", delivery.queue, reason)
        if message is not None:
            self._tell("dead_lettered", message, delivery.queue, reason=reason)
            tracer = tracing.current()
            if tracer is not None:
                tracer.rejected(message, delivery.queue, self.config.hostname, reason)
            if self.results is not None and wanted(message):
                self.results.dead_lettered(message, reason)
        else:
            self.metrics.record("dead_lettered", delivery.queue)
        self.held.settle(f"dead-lettering a message from {delivery.queue}",
                         lambda: self.broker.dead_letter(delivery, reason))

    # -- starting runs --------------------------------------------------------------------

    def _start_pending(self) -> None:
        while self.pending and self.draining_since is None:
            runner = self.pool.take()
            if runner is None:
                return
            self._start(self.pending.popleft(), runner)

    def _start(self, run: Run, runner: Runner) -> None:
        m, c = run.message, self.config
        memory, hard, soft = self._limits(m)
        run.runner, run.started = runner, time.monotonic()
        run.soft_at = run.started + soft if soft else math.inf
        run.hard_at = run.started + (hard or (soft + c.soft_grace if soft else math.inf))
        wire = self._wire(m)
        if run.trace is not None:  # the task's context names its run span
            wire["headers"][tracing.TRACEPARENT] = run.trace.starting()
        try:
            self.pool.start(runner, run, {"message": wire}, memory)
        except OSError as exc:  # the runner died while idle: another one will take the task
            log.warning("runner %d could not take %s (%s); trying another", runner.pid,
                        run.log_label, exc)
            self.pool.abandon(runner)
            self.pending.appendleft(run)
            return
        self.running.add(run)
        self.metrics.runner_wait(run.started - run.accepted)
        self._tell("started", m, run.delivery.queue, pid=runner.pid)
        self._gauges()

    def runners(self) -> dict[str, Any]:
        """What each runner slot holds now, for the worker's heartbeat (from any thread):
        its task (the name only; a command's program only: its arguments may hold
        secrets), for how long, and the memory charged to its lane now against the task's
        cap (0: no cap); and per queue the tasks that succeeded and failed since start."""
        now, slots = time.monotonic(), []
        for lane, run, used in self.pool.usage():
            slot: dict[str, Any] = {"slot": lane.index, "memory": used, "task": None}
            if isinstance(run, Run):
                m = run.message
                slot.update(task=m.task or os.path.basename(m.command[0] if m.command else ""),
                            id=m.id,
                            queue=m.queue, seconds=round(now - run.started, 1),
                            limit=lane.slot.memory_limit)
            slots.append(slot)
        finished = {queue: list(counts) for queue, counts in dict(self.finished).items()}
        return {"limiter": self.limiter.kind, "slots": slots, "finished": finished}

    def _limits(self, m: Message) -> tuple[int, float, float]:
        """Memory cap, hard and soft time limits: the message's, else the task's, else ours."""
        c = self.config
        task = REGISTRY.get(m.task)
        o = task.options if task else None
        return (m.memory_limit or (o.memory_limit if o else 0) or c.memory_limit,
                m.time_limit or (o.time_limit if o else 0) or c.time_limit,
                m.soft_time_limit or (o.soft_time_limit if o else 0) or c.soft_time_limit)

    @staticmethod
    def _wire(message: Message) -> dict[str, Any]:
        return {"task": message.task, "command": list(message.command),
                "args": list(message.args), "kwargs": dict(message.kwargs), "id": message.id,
                "queue": message.queue, "attempt": message.attempt,
                "headers": dict(message.headers)}

    # -- finishing runs -------------------------------------------------------------------

    def _settle_finished(self) -> None:
        while not self.pool.finished.empty():
            runner = self.pool.finished.get_nowait()
            run: Run = runner.task
            self.running.discard(run)
            outcome = self._outcome(run, runner)
            keeper = self.results if wanted(run.message) else None
            if keeper is not None:
                outcome = keeper.check(outcome)
            report_only = run.message.headers.get("settle") == "report"
            action = self._action(run, outcome, runner, report_only)
            if run.trace is not None:
                run.trace.ran(runner.report, outcome.kind, outcome.reason, outcome.error,
                              runner.pid)
            self._report(run, outcome, action, time.monotonic() - run.started)
            if keeper is not None:  # stored before the ack: see worker/results.py
                action = keeper.keep(run.message, outcome, action)
            self._settle(run, action, outcome)
            self._release(run)
            self.pool.release(runner)
            self._gauges()

    def _outcome(self, run: Run, runner: Runner) -> Outcome:
        if runner.exec_mode and runner.report is None and runner.status is not None:
            runner.report = _exec_report(runner.status)
        status = runner.status if runner.exited else 0
        oom = self.pool.oom_killed(runner)
        return classify(Facts(runner.report, status, oom, run.hard_timed_out, run.interrupted,
                              last_words=runner.last_line.strip()[-500:]))

    def _action(self, run: Run, outcome: Outcome, runner: Runner, report_only: bool) -> Action:
        if (runner.report or {}).get("outcome") == "unknown_task":
            return Action("dead_letter", reason=runner.report["reason"])  # type: ignore[index]
        return decide(outcome, run.message.attempt, run.budget, report_only)

    def _report(self, run: Run, outcome: Outcome, action: Action, duration: float) -> None:
        """Publish the outcome before settling the message: nothing is acked unreported."""
        m, queue = run.message, run.delivery.queue
        retry_in = action.delay if action.verb == "retry" else 0.0
        kind = {"killed": "failed", "lost": "failed", "retry_requested": "failed"}.get(
            outcome.kind, outcome.kind)
        if kind != "interrupted":   # requeued at shutdown: it did not finish
            done, failed = self.finished.get(queue, (0, 0))
            ok = kind == "succeeded"
            self.finished[queue] = (done + ok, failed + (not ok))
        where: dict[str, Any] = {"pid": run.runner.pid, "log": tuple(run.runner.tail)} \
            if run.runner is not None else {}
        self._tell(kind, m, queue, duration, result=outcome.result, error=dict(outcome.error),
                   reason=outcome.reason, retry_in=retry_in, started_at=time.time() - duration,
                   **where)
        if action.verb == "retry":
            self._tell("retried", m, queue, reason=action.reason, retry_in=retry_in)
        elif action.verb == "dead_letter":
            self._tell("dead_lettered", m, queue, reason=action.reason)
        level = logging.INFO if outcome.kind == "succeeded" else logging.WARNING
        if log.isEnabledFor(level):  # its label is formatted eagerly: not for nothing
            log.log(level, "%s %s in %.3fs -> %s %s", run.log_label, outcome.kind, duration,
                    action.verb, action.reason)

    def _settle(self, run: Run, action: Action, outcome: Outcome | None) -> None:
        """Settle now, or hold it while the broker is unreachable (see worker/outage.py)."""
        self.held.settle(run.log_label, lambda: self._send_settle(run, action))
        if run.trace is not None:
            run.trace.settled(action.verb, action.reason)

    def _send_settle(self, run: Run, action: Action) -> None:
        d = run.delivery
        try:
            if action.verb == "ack":
                self.broker.ack_soon(d)  # answered with the next claim: one round trip
            elif action.verb == "retry":
                body = self.codec.encode(run.message.next_attempt())
                self.broker.retry_later(d, action.delay, body)
            elif action.verb == "requeue":
                self._tell("interrupted", run.message, d.queue, reason=action.reason)
                self.broker.retry_later(d, 0.0)
            else:
                self.broker.dead_letter(d, action.reason)
        except LeaseLost as exc:
            log.warning("%s: %s", run.log_label, exc)

    def _release(self, run: Run) -> None:
        if run.limits and self.gate is not None:
            self.gate.release(run.message.id, run.limits)

    # -- time: limits, heartbeats, drain ----------------------------------------------------

    def _check_timers(self, now: float) -> None:
        for run in list(self.running):
            if now >= run.hard_at and not run.hard_timed_out and not run.interrupted:
                run.hard_timed_out = True
                self._kill(run)
            elif now >= run.soft_at and run.runner is not None:
                run.soft_at = math.inf
                run.runner.signal(signal.SIGUSR1)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_interval
            self._heartbeat()
        if self.gate is not None:
            self.gate.tick(time.time())
        if self.draining_since is not None and (
                self.cold or now - self.draining_since >= self.config.drain_timeout):
            self._interrupt_all()

    def _kill(self, run: Run) -> None:
        """SIGKILL the runner; what it forked is killed when its lane is released."""
        if run.runner is not None:
            run.runner.signal(signal.SIGKILL)

    def _heartbeat(self) -> None:
        self._renew_limits()
        for delivery in list(self.spare):
            try:
                self.broker.extend_lease(delivery)
            except LeaseLost:
                self.spare.remove(delivery)  # someone else's now
            except BrokerConnectionError:
                break
        for run in [*self.running, *self.pending]:
            try:
                self.broker.extend_lease(run.delivery)
            except LeaseLost as exc:
                log.error("%s: %s", run.log_label, exc)
            except BrokerConnectionError as exc:  # settles will wait for it; leases may lapse
                log.warning("heartbeat skipped: %s", exc)
                return
            if run in self.running:
                self._tell("heartbeat", run.message, run.delivery.queue)

    def _renew_limits(self) -> None:
        held = [(r.message.id, r.limits) for r in [*self.running, *self.pending] if r.limits]
        if held and self.gate is not None:
            try:
                self.gate.renew(held)
            except Exception as exc:  # noqa: BLE001 - the limiter store's own errors
                log.warning("could not renew limit tokens (%s); they lapse with the lease",
                            exc)

    def _interrupt_all(self) -> None:
        why = ("cold stop: a second stop signal came while draining" if self.cold else
               f"the drain timeout ({self.config.drain_timeout:g} s) passed")
        for run in self.running:
            if not run.interrupted:
                run.interrupted = True
                log.warning("%s killed and requeued: %s", run.log_label, why)
                self._kill(run)

    def _on_stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            log.warning("%s: draining: no new tasks; %d running get up to %.0fs to finish "
                        "(send it again to stop at once)", name, len(self.running),
                        self.config.drain_timeout)
            self.broker.pause()
            self._on_pool_change()
            return
        self.cold = True
        log.warning("%s again: cold shutdown: killing %d running tasks and requeueing them",
                    name, len(self.running))
        self.broker.wakeup()
        self._on_pool_change()

    # -- events -----------------------------------------------------------------------------

    def _event(self, kind: str, m: Message, **fields: Any) -> Event:
        return Event(kind=kind, message_id=m.id, task=m.label, attempt=m.attempt,
                     delivery=m.deliveries, run_id=m.run_id, trace_id=m.trace_id,
                     hostname=self.config.hostname, pid=fields.pop("pid", os.getpid()),
                     headers=dict(m.headers), **fields)

    def _tell(self, kind: str, m: Message, queue: str, duration: float | None = None,
              **fields: Any) -> None:
        """Record an event in the metrics and publish it to the message's reply_to (built
        only then: most tasks have no listener, and this runs twice per task)."""
        self.metrics.record(kind, queue, duration)
        if not m.reply_to:
            return
        event = self._event(kind, m, **fields)
        try:
            self.broker.publish(m.reply_to, event.encode())
        except ConveyorError as exc:
            log.error("could not report %s of %s to %s: %s", kind, m.label, m.reply_to, exc)

    def _gauges(self) -> None:
        self.metrics.load(len(self.running) + len(self.pending),
                          self.config.concurrency - len(self.running))


def _exec_report(status: int) -> dict[str, Any]:
    """How an exec'd command ended, as a runner report."""
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return {"outcome": "succeeded", "result": {"exit_code": 0}}
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        return {"outcome": "failed", "reason": f"command exited with code {code}",
                "error": {"type": "CommandFailed", "message": f"exit code {code}"}}
    return {}
