"""Consuming through kombu, moving due delayed messages, settling, and waking a blocked
consumer (see the package docstring for what kombu cannot express).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence

import kombu
from kombu import Exchange, Producer, Queue
from kombu.message import Message as KombuMessage

from conveyor.broker.bands import priority_headers
from conveyor.broker.base import Delivery
from conveyor.broker.kombu.messages import Receipt, _header_float
from conveyor.broker.kombu.producer import KombuProducer
from conveyor.broker.kombu.settings import (
    DEAD_AT_HEADER,
    DELIVERIES_HEADER,
    DUE_HEADER,
    ID_HEADER,
    LEVEL_POLL,
    LEVEL_SCAN,
    REASON_HEADER,
    TOP_LEVEL,
    level_floor,
    level_of,
)
from conveyor.broker.kombu.subscription import Channels, Subscription
from conveyor.errors import BrokerError, LeaseLost

log = logging.getLogger("conveyor.broker.kombu")


class KombuConsumer(KombuProducer):
    """Consuming, settling and wake-ups."""

    def consume(self, queues: Sequence[str], *, prefetch: int = 1, timeout: float = 1.0,
                ahead: int = 0) -> Generator[Delivery | None, float | None, None]:
        """`Broker.consume`; when the caller drops the loop, this object stops taking
        messages: kombu pushes them, and an abandoned subscription would sit on them."""
        mine = self._loop = object()  # a newer loop replaces this one's subscription
        try:
            yield from super().consume(queues, prefetch=prefetch, timeout=timeout, ahead=ahead)
        finally:
            if self._loop is mine:
                self._want = None
                self._retire()

    def _start_consuming(self, queues: Sequence[str], prefetch: int) -> None:
        self._retire()
        self._want = (tuple(queues), prefetch)
        self._next_look = {(q, k): 0.0 for q in queues for k in range(TOP_LEVEL + 1)}

    def _retire(self) -> None:
        """Cancel the subscription's consumers and give back what it buffered; held
        deliveries stay settleable (the channel stays)."""
        sub, self._sub = self._sub, None
        if sub is None or self._conn is None:
            return
        try:
            sub.stop()
        except self._errors as exc:
            self._consumer_failed("stopping a consumer", exc)

    def _channels(self) -> Channels:
        """The connection's consuming channel and wake queue, opened on first use."""
        if self._chans is None:
            self._chans = Channels.open(self, self._connection())
        return self._chans

    def _subscription(self) -> Subscription | None:
        """The live subscription, re-made after a connection loss (None while unreachable)."""
        if self._sub is None and self._want is not None:
            self._sub = self._recovery.attempt("subscribing", self._subscribe,
                                               self._interrupted, budget=0.0)
        return self._sub

    def _subscribe(self) -> Subscription:
        """One attempt of `_subscription`."""
        assert self._want is not None
        try:
            self._connection()
            return Subscription(self, *self._want)
        except self._errors:
            self._drop()
            raise

    def _consumer_failed(self, what: str, exc: BaseException) -> None:
        self._drop()
        self._recovery.failed(what, exc)

    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        sub = self._subscription()
        if sub is None:
            return []
        try:
            self._move_due(queues)
            sub.drain(0)
            # One at a time: the rest stay in our buffers, which a dropped loop gives back
            # (the base loop's own list would be lost with it).
            return sub.take(min(limit, 1))
        except self._errors as exc:
            self._consumer_failed(f"claiming from {list(queues)}", exc)
            return []

    def claim_more(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """What the consumers buffered, then a get (basic.get) per message until `limit`
        or the queues are empty: a kombu consumer holds no more than its prefetch."""
        sub = self._subscription()
        if sub is None or self._paused:
            return []
        got: list[Delivery] = []
        try:
            self._move_due(queues)
            got += sub.take(limit)
            for queue in queues:
                got += sub.get(queue, limit - len(got))
        except self._errors as exc:
            self._consumer_failed(f"claiming a batch from {list(queues)}", exc)
        self._held(len(got))  # from a lost connection they raise LeaseLost when settled
        return got

    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """Block on the connection until a delivery, a wake-up, or the next level look."""
        sub = self._subscription()
        if sub is None:
            self._interrupted.wait(min(timeout, self._recovery.pause()))
            return
        try:
            self._move_due(queues)  # also while full: moving is not claiming
            if self._next_look:
                timeout = min(timeout, min(self._next_look.values()) - time.monotonic())
            if timeout > 0:
                sub.drain(timeout)
        except self._errors as exc:
            self._consumer_failed(f"waiting on {list(queues)}", exc)

    def _move_due(self, queues: Sequence[str]) -> None:
        """Look at every delay level whose time has come (see the module docstring)."""
        now = time.monotonic()
        for queue in queues:
            for level in range(TOP_LEVEL + 1):
                if self._next_look.get((queue, level), math.inf) <= now:
                    self._next_look[(queue, level)] = self._look(queue, level)

    def _look(self, queue: str, level: int) -> float:
        """Move due and walk-down messages of one level; when to look at it again."""
        name = self._level_name(queue, level)
        if name not in self._declared:
            self._declare(name)
        floor = level_floor(level)
        next_look = time.monotonic() + max(LEVEL_POLL, floor / 4)
        kept: list[KombuMessage] = []
        for _ in range(LEVEL_SCAN):
            message = Queue(name, channel=self._channel, no_declare=True).get(no_ack=False)
            if message is None:
                break
            remaining = _header_float(message.headers or {}, DUE_HEADER) - time.time()
            if remaining <= 0 or level_of(remaining) < level:
                self._place(queue, message.body, dict(message.headers or {}), remaining)
                message.ack()
            else:
                kept.append(message)
                next_look = min(next_look, time.monotonic() + remaining - floor)
        else:
            next_look = min(next_look, time.monotonic() + LEVEL_POLL)
        for message in kept:
            message.requeue()
        return next_look

    def _owned(self, delivery: Delivery, what: str) -> Receipt:
        receipt = delivery.receipt
        if not isinstance(receipt, Receipt):
            raise BrokerError(f"{what}: this delivery did not come from this kombu broker")
        if receipt.epoch != self._epoch:
            self._release(receipt)
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r}: the connection "
                            "it came on was lost, so the broker will redeliver it; its "
                            "outcome was not recorded")
        if receipt.done:
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r}: it was "
                            "already settled")
        return receipt

    def _finish(self, delivery: Delivery, what: str,
                before: Callable[[], None] | None = None) -> None:
        """Run `before` (a re-publish), then ack; a connection loss means LeaseLost."""
        receipt = self._owned(delivery, what)
        try:
            if before is not None:
                before()
            receipt.message.ack()
        except self._errors as exc:
            self._consumer_failed(what, exc)
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r} did not reach "
                            f"the broker ({exc!r}): it will be redelivered") from exc
        finally:
            self._release(receipt)

    def ack(self, delivery: Delivery) -> None:
        self._finish(delivery, "ack")

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        """Publish a copy carrying the delivery count (through a delay level), then ack."""
        headers = {ID_HEADER: uuid.uuid4().hex, DELIVERIES_HEADER: delivery.delivery_count,
                   **priority_headers(delivery.priority)}
        new_body = delivery.body if body is None else body
        self._finish(delivery, "retry_later",
                     lambda: self._place(delivery.queue, new_body, headers, delay))

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Publish to `<queue>.dead` with reason, time and count in headers, then ack."""
        old = delivery.receipt.message.headers if isinstance(delivery.receipt, Receipt) else {}
        headers = {ID_HEADER: (old or {}).get(ID_HEADER) or uuid.uuid4().hex,
                   REASON_HEADER: reason, DEAD_AT_HEADER: repr(time.time()),
                   DELIVERIES_HEADER: delivery.delivery_count,
                   **priority_headers(delivery.priority)}
        self._finish(delivery, "dead_letter",
                     lambda: self._send(self._name(delivery.queue, ".dead"), delivery.body,
                                        headers))

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        """Check the delivery is still ours and keep the connection busy.

        On AMQP that is the whole lease (it lives as long as the connection). kombu's
        virtual transports have no way to push a visibility timeout back: see the module
        docstring.
        """
        self._owned(delivery, "extend_lease")
        sub = self._sub
        try:
            if sub is not None:
                sub.drain(0)
        except self._errors as exc:
            self._consumer_failed("extending a lease", exc)
        self._owned(delivery, "extend_lease")

    def _interrupt_wait(self) -> None:
        """Publish to our wake queue through a second connection (ours may be blocked).

        A signal handler may call this on the consuming thread while that thread is in
        the middle of an earlier wake-up: that one already wakes the consumer.
        """
        sub = self._sub
        if sub is None or self._waker_owner == threading.get_ident():
            return
        try:
            with self._lock:
                self._waker_owner = threading.get_ident()
                try:
                    self._wake(sub.wake_queue)
                finally:
                    self._waker_owner = None
        except Exception as exc:  # wakeup() must return; the consumer's own loop recovers
            log.warning("kombu wake-up through %s failed (%r); the consumer wakes at its "
                        "next timeout instead", self.settings.where, exc)
            self._waker = None

    def _wake(self, wake_queue: str) -> None:
        if self._waker is None:
            self._waker = kombu.Connection(self.settings.url, connect_timeout=5,
                                           transport_options=dict(
                                               self.settings.transport_options))
        producer = Producer(self._waker.default_channel, exchange=Exchange(""))
        producer.publish(b"!", routing_key=wake_queue, content_type="application/octet-stream",
                         content_encoding="binary", delivery_mode=1)
