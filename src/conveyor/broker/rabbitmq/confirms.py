"""Publisher confirms for a batch: publish many, then wait once for all their confirms.

pika's BlockingChannel in confirm mode waits for each message's confirm before the next
publish: one round trip per message. A mover such as the Celery intake publishes batches,
so this channel takes confirms itself from pika's underlying channel: it sends every
message of a batch, then runs the connection's I/O until RabbitMQ has confirmed (or
refused) each one. Messages RabbitMQ returned as unroutable are handed back, so the broker
can declare their queue again and publish them once more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pika import BasicProperties, spec
from pika.adapters.blocking_connection import BlockingChannel

from conveyor.errors import BrokerError

#: (exchange, routing key, body) of one message of a batch.
Outgoing = tuple[str, str, bytes]


class BatchConfirms:
    """One channel in confirm mode whose confirms are counted per batch."""

    def __init__(self, channel: BlockingChannel) -> None:
        self.channel = channel
        self._impl = channel._impl  # the async channel below the blocking one
        self._next_tag = 1
        self._waiting: set[int] = set()
        self._nacked = 0
        self._returned: list[Outgoing] = []
        selected: list[Any] = []
        self._impl.confirm_delivery(ack_nack_callback=self._on_confirm,
                                    callback=selected.append)
        self._impl.add_on_return_callback(self._on_return)
        self._run_until(lambda: bool(selected))

    @property
    def is_open(self) -> bool:
        return bool(self.channel.is_open)

    def send(self, batch: Sequence[Outgoing],
             props: Sequence[BasicProperties]) -> list[Outgoing]:
        """Publish `batch` (mandatory, each with its `props`), wait for every confirm;
        return the messages RabbitMQ could not route. Raises BrokerError if any was
        refused."""
        self._nacked, self._returned = 0, []
        for (exchange, key, body), message_props in zip(batch, props, strict=True):
            self._impl.basic_publish(exchange, key, body, message_props, mandatory=True)
            self._waiting.add(self._next_tag)
            self._next_tag += 1
        self._run_until(lambda: not self._waiting)
        if self._nacked:
            raise BrokerError(f"RabbitMQ refused to store {self._nacked} of {len(batch)} "
                              "messages (basic.nack): a queue may be full or the node out of "
                              "disk or memory; see the RabbitMQ log")
        return self._returned

    def _run_until(self, done: Any) -> None:
        """Run the connection's I/O until `done()`, as BlockingChannel does for its own
        waits (it raises if RabbitMQ closes the channel or the connection meanwhile)."""
        if not done():
            self.channel._flush_output(done)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = ({t for t in self._waiting if t <= method.delivery_tag} if method.multiple
                else {method.delivery_tag})
        self._waiting -= tags
        if isinstance(method, spec.Basic.Nack):
            self._nacked += len(tags)

    def _on_return(self, _channel: Any, method: Any, _props: Any, body: bytes) -> None:
        self._returned.append((method.exchange, method.routing_key, body))
