"""The supervisor's intake: a delivery read, vetted and admitted, or settled unrun.

Bad input is dead-lettered at once and never retried (not a message, over its delivery cap,
an unknown task, a bad limits header); a message past its deadline to start is settled
unrun; a limited one goes through the flow gate (worker/flow.py), which may park it and
what waits behind it. What is admitted becomes a `Run` waiting for a runner. `Intake` is
the base of `Supervisor`, which owns the state declared here (main thread only).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import replace
from typing import Any

from conveyor.broker import Consumer, Delivery
from conveyor.errors import LeaseLost, MessageError
from conveyor.flow import LIMITS_HEADER, UNIQUE_HEADER, Spec, limits_of
from conveyor.message import Codec, Message
from conveyor.worker.cancelling import Canceller
from conveyor.worker.config import WorkerConfig
from conveyor.worker.flow import Gate
from conveyor.worker.observers import Observers
from conveyor.worker.outage import HeldSettles
from conveyor.worker.run import Run
from conveyor.worker.terms import budget_of, unrunnable

log = logging.getLogger("conveyor.worker")


class Intake:
    """Accepting deliveries: the part of the supervisor before a run meets its runner."""

    config: WorkerConfig
    broker: Consumer
    codec: Codec
    gate: Gate | None
    observers: Observers
    held: HeldSettles  # settles the broker could not take
    pending: deque[Run]
    running: set[Run]
    spare: deque[Delivery]
    cancels: Canceller  # what was cancelled: refused unrun

    def _accept(self, delivery: Delivery) -> None:
        """Decode and vet a delivery; bad input is dead-lettered at once, never retried."""
        try:
            message = self.codec.decode(delivery.body)
        except MessageError as exc:
            self._reject(delivery, f"bad message: {exc}")
            return
        if message.expired(time.time()):
            self._refuse_expired(delivery, message)
            return
        if message in self.cancels:
            self._refuse_cancelled(delivery, message)
            return
        budget = budget_of(message, self.config)
        why = unrunnable(delivery, message, budget)
        if why is not None:
            self._reject(delivery, why, message)
            return
        message = replace(message, deliveries=delivery.delivery_count)
        limits = self._limits_of(delivery, message)
        if limits is None:
            return
        run = Run(delivery, message, budget, limits=limits)
        self.observers.accepted(run)
        self.pending.append(run)

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
        if not specs or message.expired(time.time()) or message in self.cancels \
                or unrunnable(delivery, message, budget_of(message, self.config)):
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

    def _reject(self, delivery: Delivery, reason: str, message: Message | None = None) -> None:
        log.warning("dead-lettering a message from %s: %s", delivery.queue, reason)
        if message is not None:
            self._tell("dead_lettered", message, delivery.queue, reason=reason)
            self.observers.rejected(message, delivery.queue, reason)
        else:
            self.observers.unreadable(delivery.queue, reason)
        self.held.settle(f"dead-lettering a message from {delivery.queue}",
                         lambda: self.broker.dead_letter(delivery, reason))
        if message is not None:
            self._unhold(message)

    def _refuse_expired(self, delivery: Delivery, message: Message) -> None:
        """Settle a message past its deadline to start (`Message.expires`) without running
        it, and say so: an `expired` event to its reply_to, the metric, a log line, and its
        result record when it asked for one (REVOKED for a Celery client).

        A message someone enqueued with `expires` (or a Celery message's) is dead-lettered
        with reason `expired: …`, so an operator sees it (`dead-letters list`) and may
        requeue it. A DAG attempt (`settle: report`) is only acked: its `expired` event
        makes the scheduler time the attempt out (or it already did, by its own timer) and
        publish the next attempt, so its message is stale work the run has moved past; a dead
        letter of it would offer operators a requeue of an attempt that must never run."""
        late = time.time() - message.expires
        stale_attempt = message.headers.get("settle") == "report"
        reason = (f"not started by its deadline (expires {message.expires:.3f}, "
                  f"{late:.3f} s ago)")
        log.warning("%s expired: %s: %s", message.log_words, reason,
                    "acked unrun (a DAG attempt)" if stale_attempt else "dead-lettered")
        self._tell_unrun("expired", delivery, message, reason)

        def settle() -> None:
            try:
                if stale_attempt:
                    self.broker.ack(delivery)
                else:
                    self.broker.dead_letter(delivery, f"expired: {reason}")
            except LeaseLost:
                pass  # its lease lapsed: whoever holds it now refuses it the same way
        self.held.settle(f"settling an expired message of {delivery.queue}", settle)
        self._unhold(message)

    def _refuse_cancelled(self, delivery: Delivery, message: Message) -> None:
        """Ack a cancelled message (`Client.cancel`) without running it: not retried, not
        dead-lettered; said as an expired one is."""
        reason = "cancelled before it started"
        log.warning("%s cancelled: %s: acked unrun", message.log_words, reason)
        self._tell_unrun("cancelled", delivery, message, reason)

        def ack() -> None:
            try:
                self.broker.ack(delivery)
            except LeaseLost:
                pass  # its lease lapsed: whoever holds it now refuses it the same way
        self.held.settle(f"acking a cancelled message of {delivery.queue}", ack)
        self._unhold(message)

    def _tell_unrun(self, kind: str, delivery: Delivery, message: Message, reason: str) -> None:
        """The `kind` event of a message that ends unrun, and the observers' `unrun` hook
        (its result record, if it asked for one)."""
        self._tell(kind, replace(message, deliveries=delivery.delivery_count),
                   delivery.queue, reason=reason)
        self.observers.unrun(kind, message, delivery.queue, reason)

    def _unhold(self, message: Message) -> None:
        """Give back the message's unique key after its terminal settle (only a message
        enqueued with one pays anything; see README "Once per key")."""
        key = message.headers.get(UNIQUE_HEADER)
        if key is None:
            return
        if self.gate is None:
            log.warning("%s holds unique key %r but this worker has no limiter: it is held "
                        "until its time to live runs out", message.id, key)
            return
        self.gate.unhold(key, message.id)

    def _tell(self, kind: str, m: Message, queue: str, duration: float | None = None,
              **fields: Any) -> None:
        """Tell the observers of a lifecycle event: the metrics count it, and it is
        published to the message's reply_to (worker/observers.py)."""
        self.observers.told(kind, m, queue, duration, **fields)
