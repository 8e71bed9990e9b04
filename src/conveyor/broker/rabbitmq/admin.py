"""Administering RabbitMQ queues: their dead letters, listed from the management plugin and
browsed with `basic.get` (see the package docstring), and purging.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from conveyor.broker.bands import band_of, priority_headers, priority_of
from conveyor.broker.base import DeadLetter
from conveyor.broker.rabbitmq.bands import bands_high_first
from conveyor.broker.rabbitmq.headers import dead_id, dead_letter_of, properties
from conveyor.broker.rabbitmq.inspector import RabbitMQInspector
from conveyor.broker.rabbitmq.ladder import dead_queue
from conveyor.errors import BrokerError

LOG = logging.getLogger("conveyor.broker.rabbitmq")


class RabbitMQAdmin(RabbitMQInspector):
    """Dead letters (browse, re-queue, delete) and purging."""

    def dead_queues(self) -> list[str]:
        """From the management plugin (AMQP cannot list queues): `<queue>.dead` queues with
        messages in this virtual host."""
        return self._mgmt.dead_queues()

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """Browse `<queue>.dead` with basic.get, then nack them all back in order."""
        return self._call(f"listing dead letters of queue {queue!r}",
                          lambda: self._browse(queue, limit))

    def _browse(self, queue: str, limit: int) -> list[DeadLetter]:
        """A `<queue>.dead` deleted meanwhile (an operator, a test's teardown: the listing
        that named it lags) holds no dead letters: [], not RabbitMQ's 404."""
        channel = self._connection().channel()
        try:
            found = self._get_many(channel, dead_queue(queue), limit)
            if found:
                channel.basic_nack(found[-1][0].delivery_tag, multiple=True, requeue=True)
            return [dead_letter_of(queue, method, props, body) for method, props, body in found]
        except pex.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            return []
        finally:
            _close_quietly(channel)

    def _get_many(self, channel: BlockingChannel, name: str,
                  limit: int) -> list[tuple[Basic.GetOk, BasicProperties, bytes]]:
        found: list[tuple[Basic.GetOk, BasicProperties, bytes]] = []
        if self._passive(name) is None:
            return found
        while len(found) < limit:
            method, props, body = channel.basic_get(name)
            if method is None or props is None or body is None:
                break
            found.append((method, props, body))
        return found

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Move dead letters back to `queue` as new messages with a fresh delivery count."""
        return self._call(f"re-queueing dead letters of queue {queue!r}",
                          lambda: self._requeue(queue, None if ids is None else set(ids)))

    def _requeue(self, queue: str, wanted: set[str] | None) -> int:
        def move(props: BasicProperties, body: bytes) -> None:
            priority = priority_of(props.headers)
            self._publish(queue, body, properties(props.message_id, priority_headers(priority)),
                          0, band=band_of(priority))
        return self._take_dead(queue, wanted, move)

    def _take_dead(self, queue: str, wanted: set[str] | None,
                   act: Callable[[BasicProperties, bytes], None]) -> int:
        """Walk `<queue>.dead` in order: `act` on each dead letter in `wanted` (all if None),
        then ack it away; nack the others back, in order. How many were taken."""
        if (wanted is not None and not wanted) or self._passive(dead_queue(queue)) is None:
            return 0
        channel = self._connection().channel()
        taken, kept = 0, 0
        try:
            for method, props, body in _drain(channel, dead_queue(queue)):
                if wanted is not None and dead_id(props, body) not in wanted:
                    kept = method.delivery_tag
                    continue
                act(props, body)
                channel.basic_ack(method.delivery_tag)
                taken += 1
                if wanted is not None:
                    wanted.discard(dead_id(props, body))
                    if not wanted:
                        break
            if kept:
                channel.basic_nack(kept, multiple=True, requeue=True)
        except pex.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            # deleted meanwhile: what was acked before is taken, the rest went with it
        finally:
            _close_quietly(channel)
        return taken

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters: all (queue.purge of `<queue>.dead`) or those in `ids`."""
        if ids is None:
            return self._call(f"purging dead letters of queue {queue!r}",
                              lambda: self._purge_one(dead_queue(queue)))
        return self._call(f"deleting dead letters of queue {queue!r}",
                          lambda: self._delete_dead(queue, set(ids)))

    def _delete_dead(self, queue: str, wanted: set[str]) -> int:
        """Ack (delete) the dead letters in `wanted`; nack the others back in order."""
        return self._take_dead(queue, wanted, lambda props, body: None)

    def purge(self, queue: str) -> int:
        """Purge the queue, its bands, delay levels and dead letters (in-flight ones stay)."""
        names = set(self._listing(queue, fresh=True)) | set(bands_high_first(queue))
        return self._call(f"purging queue {queue!r}",
                          lambda: sum(self._purge_one(name) for name in sorted(names)))

    def _purge_one(self, name: str) -> int:
        try:
            return int(self._channel("admin").queue_purge(name).method.message_count)
        except pex.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return 0
            raise BrokerError(f"RabbitMQ refused to purge queue {name!r}: "
                              f"{exc.reply_text}") from exc


def _drain(channel: BlockingChannel,
           name: str) -> Iterable[tuple[Basic.GetOk, BasicProperties, bytes]]:
    """basic.get until the queue is empty (what is got stays unacked until settled)."""
    while True:
        method, props, body = channel.basic_get(name)
        if method is None or props is None or body is None:
            return
        yield method, props, body


def _close_quietly(channel: BlockingChannel) -> None:
    if channel.is_open:
        try:
            channel.close()
        except (pex.AMQPError, OSError) as exc:
            LOG.debug("closing a browsing channel: %r", exc)
