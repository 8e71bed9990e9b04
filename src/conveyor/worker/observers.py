"""What follows a task's life in the worker besides the supervisor itself: the hooks.

Tracing, result keeping, metrics, lifecycle events and flow control each hook in as an
`Observer` (dramatiq's middleware is the model): the supervisor calls the same hook of
every observer at each step of a delivery's life, in the order they were handed in, and
knows none of them by name. The steps, in order for a delivery that runs:

    accepted   read, vetted and admitted: it waits for a runner
    starting   its runner is about to get it (the headers the task will see)
    started    its runner has it
    finished   its runner is done: may change the outcome (results: a value over the cap)
    decided    the action is chosen (retry, dead-letter ...), before anything is said
    settling   before the settle: may change the action (results: stored, else requeue)
    settled    the settle is sent, or held while the broker is away (worker/outage.py)
    released   the worker no longer holds it (its flow-control tokens go back)

A delivery that never runs is `unreadable` (not a message), `rejected` (dead-lettered
unrun) or `unrun` (expired or cancelled); `told` hears every lifecycle event (`conveyor.events`)
the supervisor reports, `load` its slots after any change, `heartbeat` the runs it holds
(a broker call each: the main thread's) and `tick` its loop's turns. Hooks run on the
supervisor's main thread, `close` once, as it stops. A hook that raises stops the worker,
as the code it replaced did: each observer catches what its own store may raise.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from conveyor import tracing
from conveyor.broker import Producer
from conveyor.errors import ConveyorError
from conveyor.events import Event
from conveyor.message import Message
from conveyor.worker.metrics import Metrics
from conveyor.worker.outcome import Action, Outcome
from conveyor.worker.pool import Runner
from conveyor.worker.results import ResultKeeper, wanted
from conveyor.worker.run import Run

log = logging.getLogger("conveyor.worker")


class Observer:
    """One part of the worker that follows each delivery's life; every hook does nothing
    here, so an observer overrides only the steps it cares about."""

    def accepted(self, run: Run) -> None:
        """A delivery was read, vetted and admitted; it waits for a runner."""

    def unreadable(self, queue: str, reason: str) -> None:
        """A delivery that is not a message is dead-lettered."""

    def rejected(self, message: Message, queue: str, reason: str) -> None:
        """A readable message is dead-lettered without running (over its delivery cap, an
        unknown task, a bad limits header, too large for a runner)."""

    def unrun(self, kind: str, message: Message, queue: str, reason: str) -> None:
        """A message ends without running: `kind` "expired" (past its deadline to start)
        or "cancelled" (`Client.cancel`)."""

    def starting(self, run: Run, headers: dict[str, Any]) -> None:
        """Its runner is about to get it; `headers` are what the task will see."""

    def started(self, run: Run) -> None:
        """Its runner has it (`run.started`, `run.runner` are set)."""

    def finished(self, run: Run, outcome: Outcome) -> Outcome:
        """Its runner is done; the outcome the worker acts on (this one, or another)."""
        return outcome

    def decided(self, run: Run, runner: Runner, outcome: Outcome, action: Action) -> None:
        """What happens to its message is chosen; nothing is reported yet."""

    def settling(self, run: Run, outcome: Outcome, action: Action) -> Action:
        """Just before its settle: the action sent (this one, or another)."""
        return action

    def settled(self, run: Run, action: Action) -> None:
        """Its settle is sent (or held until the broker is back)."""

    def released(self, run: Run) -> None:
        """The worker no longer holds it: settled, or given back unstarted."""

    def told(self, kind: str, message: Message, queue: str, duration: float | None,
             fields: dict[str, Any]) -> None:
        """A lifecycle event (`Event.kind`) of `message` on `queue`; `fields` are the
        event's other fields (its run time is `duration`, once it ended)."""

    def load(self, in_flight: int, free_slots: int) -> None:
        """Deliveries held and runner slots free, after any change."""

    def heartbeat(self, runs: Sequence[Run]) -> None:
        """Every heartbeat interval: the runs held (running or waiting for a runner)."""

    def tick(self, now: float) -> None:
        """Every turn of the supervisor's loop (`time.time()`): keep it cheap."""

    def close(self) -> None:
        """The worker stops."""


class Observers:
    """The observers of one supervisor, called hook by hook in the order handed in.

    Each hook keeps the list of observers that override it, so a step nobody watches
    costs one empty loop (these run a few times per task on the supervisor's path)."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.all = tuple(observers)
        self._accepted = self._overriding("accepted")
        self._unreadable = self._overriding("unreadable")
        self._rejected = self._overriding("rejected")
        self._unrun = self._overriding("unrun")
        self._starting = self._overriding("starting")
        self._started = self._overriding("started")
        self._finished = self._overriding("finished")
        self._decided = self._overriding("decided")
        self._settling = self._overriding("settling")
        self._settled = self._overriding("settled")
        self._released = self._overriding("released")
        self._told = self._overriding("told")
        self._load = self._overriding("load")
        self._heartbeat = self._overriding("heartbeat")
        self._tick = self._overriding("tick")

    def _overriding(self, hook: str) -> tuple[Any, ...]:
        base = getattr(Observer, hook)
        return tuple(getattr(o, hook) for o in self.all
                     if getattr(type(o), hook, base) is not base)

    def accepted(self, run: Run) -> None:
        for hook in self._accepted:
            hook(run)

    def unreadable(self, queue: str, reason: str) -> None:
        for hook in self._unreadable:
            hook(queue, reason)

    def rejected(self, message: Message, queue: str, reason: str) -> None:
        for hook in self._rejected:
            hook(message, queue, reason)

    def unrun(self, kind: str, message: Message, queue: str, reason: str) -> None:
        for hook in self._unrun:
            hook(kind, message, queue, reason)

    def starting(self, run: Run, headers: dict[str, Any]) -> None:
        for hook in self._starting:
            hook(run, headers)

    def started(self, run: Run) -> None:
        for hook in self._started:
            hook(run)

    def finished(self, run: Run, outcome: Outcome) -> Outcome:
        for hook in self._finished:
            outcome = hook(run, outcome)
        return outcome

    def decided(self, run: Run, runner: Runner, outcome: Outcome, action: Action) -> None:
        for hook in self._decided:
            hook(run, runner, outcome, action)

    def settling(self, run: Run, outcome: Outcome, action: Action) -> Action:
        for hook in self._settling:
            action = hook(run, outcome, action)
        return action

    def settled(self, run: Run, action: Action) -> None:
        for hook in self._settled:
            hook(run, action)

    def released(self, run: Run) -> None:
        for hook in self._released:
            hook(run)

    def told(self, kind: str, message: Message, queue: str, duration: float | None = None,
             **fields: Any) -> None:
        for hook in self._told:
            hook(kind, message, queue, duration, fields)

    def load(self, in_flight: int, free_slots: int) -> None:
        for hook in self._load:
            hook(in_flight, free_slots)

    def heartbeat(self, runs: Sequence[Run]) -> None:
        for hook in self._heartbeat:
            hook(runs)

    def tick(self) -> None:
        if self._tick:  # the clock is read only for someone
            now = time.time()
            for hook in self._tick:
                hook(now)

    def close(self) -> None:
        for observer in self.all:
            observer.close()


class Tracing(Observer):
    """OpenTelemetry spans of each delivery (conveyor.tracing), while tracing is on: looked
    up per delivery, as a tracer configured later still counts."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname

    def accepted(self, run: Run) -> None:
        tracer = tracing.current()
        if tracer is not None:
            run.trace = tracer.claimed(run.message, run.delivery.queue, self.hostname)

    def rejected(self, message: Message, queue: str, reason: str) -> None:
        tracer = tracing.current()
        if tracer is not None:
            tracer.rejected(message, queue, self.hostname, reason)

    def starting(self, run: Run, headers: dict[str, Any]) -> None:
        if run.trace is not None:  # the task's context names its run span
            headers[tracing.TRACEPARENT] = run.trace.starting()

    def decided(self, run: Run, runner: Runner, outcome: Outcome, action: Action) -> None:
        if run.trace is not None:
            run.trace.ran(runner.report, outcome.kind, outcome.reason, outcome.error,
                          runner.pid)

    def settled(self, run: Run, action: Action) -> None:
        if run.trace is not None:
            run.trace.settled(action.verb, action.reason)


class Results(Observer):
    """Results of the messages that ask for one (worker/results.py): checked against the
    size cap when the task ends, stored before the settle, recorded for those that end
    unrun."""

    def __init__(self, keeper: ResultKeeper) -> None:
        self.keeper = keeper

    def rejected(self, message: Message, queue: str, reason: str) -> None:
        if wanted(message):
            self.keeper.unrun(message, "dead_lettered", reason)

    def unrun(self, kind: str, message: Message, queue: str, reason: str) -> None:
        if wanted(message):
            self.keeper.unrun(message, kind, reason)

    def finished(self, run: Run, outcome: Outcome) -> Outcome:
        return self.keeper.check(outcome) if wanted(run.message) else outcome

    def settling(self, run: Run, outcome: Outcome, action: Action) -> Action:
        if not wanted(run.message):
            return action
        return self.keeper.keep(run.message, outcome, action)  # before the ack: results.py

    def close(self) -> None:
        self.keeper.close()


class Measured(Observer):
    """The worker's metrics (worker/metrics.py), fed by its lifecycle events."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def unreadable(self, queue: str, reason: str) -> None:
        self.metrics.record("dead_lettered", queue)

    def started(self, run: Run) -> None:
        self.metrics.runner_wait(run.started - run.accepted)

    def told(self, kind: str, message: Message, queue: str, duration: float | None,
             fields: dict[str, Any]) -> None:
        self.metrics.record(kind, queue, duration)

    def load(self, in_flight: int, free_slots: int) -> None:
        self.metrics.load(in_flight, free_slots)


class Reported(Observer):
    """Lifecycle events published to each message's reply_to, on the supervisor's broker
    connection (an event is built only then: most tasks have no listener)."""

    def __init__(self, broker: Producer, hostname: str, code_version: str = "") -> None:
        self.broker = broker
        self.hostname = hostname
        self.code_version = code_version

    def told(self, kind: str, message: Message, queue: str, duration: float | None,
             fields: dict[str, Any]) -> None:
        if not message.reply_to:
            return
        m, rest = message, {k: v for k, v in fields.items() if k != "pid"}
        event = Event(kind=kind, message_id=m.id, task=m.label, attempt=m.attempt,
                      delivery=m.deliveries, run_id=m.run_id, trace_id=m.trace_id,
                      hostname=self.hostname, pid=fields.get("pid", os.getpid()),
                      code_version=self.code_version if kind == "started" else "",
                      headers=dict(m.headers), **rest)
        try:
            self.broker.publish(m.reply_to, event.encode())
        except ConveyorError as exc:
            log.error("could not report %s of %s to %s: %s", kind, m.label, m.reply_to, exc)
