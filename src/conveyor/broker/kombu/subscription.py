"""One consume loop's kombu consumers, and the per-connection channels they live on."""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import kombu
from kombu import Consumer, Queue
from kombu.message import Message as KombuMessage

from conveyor.broker.bands import priority_of
from conveyor.broker.base import Delivery
from conveyor.broker.kombu.messages import Receipt, delivery_count
from conveyor.broker.kombu.settings import CONNECTION_BOUND, SETTLE, KombuSettings


class Host(Protocol):
    """What a subscription uses of the broker it consumes for (`KombuConsumer`): named so,
    this module needs none of the broker's own modules, which hold subscriptions."""

    settings: KombuSettings
    _epoch: int
    _declared: set[str]
    _live: set[Receipt]

    def _name(self, queue: str, suffix: str = "") -> str: ...

    def _declare(self, name: str, main: bool = False) -> int: ...

    def _connection(self) -> kombu.Connection: ...

    def _channels(self) -> Channels: ...


class Subscription:
    """One consume loop's consumers: one per queue (first listed first).

    They live on the connection's consuming channel (`Channels`), so a later loop re-uses
    it and a dropped loop's held deliveries stay settleable. Deliveries land in a buffer per
    queue; `take` hands them out in the listed order and, before handing out one from a
    later queue, asks each earlier queue for a ready message with `basic_get` (kombu may
    deliver from several queues in any order).
    """

    def __init__(self, broker: Host, queues: tuple[str, ...], prefetch: int) -> None:
        self.broker = broker
        self.queues = queues
        self.epoch = broker._epoch
        self.channels = broker._channels()
        self.buffers: dict[str, deque[KombuMessage]] = {q: deque() for q in queues}
        self.consumers = [self._consume(q, prefetch) for q in queues]
        for consumer in self.consumers:
            consumer.consume()

    @property
    def wake_queue(self) -> str:
        return self.channels.wake_queue

    def _consume(self, queue: str, prefetch: int) -> Consumer:
        name = self.broker._name(queue)
        if name not in self.broker._declared:
            self.broker._declare(name, main=True)

        def on_message(message: KombuMessage) -> None:
            self.buffers[queue].append(message)
        return Consumer(self.channels.consuming, [Queue(name, no_declare=True)], no_ack=False,
                        prefetch_count=prefetch, on_message=on_message)

    def drain(self, timeout: float) -> None:
        """Read what has arrived (timeout 0) or wait up to `timeout` for something."""
        conn = self.broker._connection()
        try:
            conn.drain_events(timeout=timeout)
            while True:  # whatever else is already here, without waiting
                conn.drain_events(timeout=0)
        except TimeoutError:
            return

    def take(self, limit: int) -> list[Delivery]:
        out: list[Delivery] = []
        while len(out) < limit:
            index = next((i for i, q in enumerate(self.queues) if self.buffers[q]), None)
            if index is None:
                break
            queue = self.queues[index]
            earlier = self._earlier(index)
            out.append(self._delivery(*(earlier or (queue, self.buffers[queue].popleft()))))
        return out

    def get(self, queue: str, limit: int) -> list[Delivery]:
        """Up to `limit` ready messages of `queue` by get, one round trip each."""
        source = Queue(self.broker._name(queue), channel=self.channels.consuming,
                       no_declare=True)
        out: list[Delivery] = []
        while len(out) < limit and (message := source.get(no_ack=False)) is not None:
            out.append(self._delivery(queue, message))
        return out

    def _earlier(self, index: int) -> tuple[str, KombuMessage] | None:
        """A ready message of a queue listed before `index`, if any (one round trip each)."""
        for queue in self.queues[:index]:
            name = self.broker._name(queue)
            message = Queue(name, channel=self.channels.consuming,
                            no_declare=True).get(no_ack=False)
            if message is not None:
                return queue, message
        return None

    def _delivery(self, queue: str, message: KombuMessage) -> Delivery:
        receipt = Receipt(message, queue, self.epoch)
        self.broker._live.add(receipt)
        return Delivery(queue=queue, body=message.body, delivery_count=delivery_count(message),
                        receipt=receipt, priority=priority_of(message.headers))

    def stop(self) -> None:
        """No more deliveries: cancel the consumers, requeue what nobody took.

        On kombu's virtual transports a BRPOP sent before the cancel may still bring one
        message: a short read lets kombu requeue it now (it has no consumer any more)
        rather than at this connection's next read.
        """
        for consumer in self.consumers:
            consumer.cancel()
        if self.broker.settings.transport not in CONNECTION_BOUND:
            self.drain(SETTLE)
        for buffer in self.buffers.values():
            while buffer:
                buffer.popleft().requeue()


@dataclass
class Channels:
    """Per connection: the channel consumers live on, and the private wake queue.

    Both outlive consume loops: closing a kombu Redis channel waits for its pending BRPOP
    (up to a second), and AMQP channels are a bounded resource.
    """

    consuming: Any
    wake_queue: str

    @classmethod
    def open(cls, broker: Host, conn: kombu.Connection) -> Channels:
        wake_queue = broker._name(f"conveyor.wake.{uuid.uuid4().hex}")
        wake = conn.channel()
        wake.queue_declare(queue=wake_queue, durable=False, auto_delete=True, exclusive=True)
        Consumer(wake, [Queue(wake_queue, no_declare=True)], no_ack=True,
                 on_message=lambda message: None).consume()
        return cls(conn.channel(), wake_queue)
