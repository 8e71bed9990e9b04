"""Publishing to RabbitMQ: `publish`, `publish_many`, and the re-publishing that retries and
dead letters are made of (see the package docstring for the topology).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pika.exceptions as pex
from pika.spec import BasicProperties

from conveyor.broker.bands import band_of, priority_headers
from conveyor.broker.base import Delivery, Publication
from conveyor.broker.rabbitmq.bands import band_queue, even_units
from conveyor.broker.rabbitmq.confirms import BatchConfirms
from conveyor.broker.rabbitmq.connection import CONNECTION_ERRORS, RabbitMQConnection
from conveyor.broker.rabbitmq.headers import properties
from conveyor.broker.rabbitmq.ladder import dead_queue, delay_units
from conveyor.errors import BrokerError, LeaseLost


class RabbitMQProducer(RabbitMQConnection):
    """Publishing: confirmed and mandatory, into the band of its priority or through the
    delay ladder."""

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        """Publish persistently into the band of `priority` (see `bands`) and wait for the
        confirm.

        A publish whose connection is lost is retried on a new one: if RabbitMQ had stored it
        before the confirm was lost, it is stored twice (at-least-once, like redelivery).
        """
        band = band_of(priority)
        units = even_units(delay_units(delay), band)
        props = properties(None, priority_headers(priority))
        self._call(f"publishing to queue {queue!r}",
                   lambda: self._publish(queue, body, props, units, band=band))

    def publish_many(self, publications: Sequence[Publication]) -> None:
        """Publish them all, then wait once for their confirms (see `confirms.py`)."""
        if publications:
            queues = sorted({p.queue for p in publications})
            self._call(f"publishing {len(publications)} messages to {queues}",
                       lambda: self._publish_batch(publications))

    def _publish_batch(self, publications: Sequence[Publication]) -> None:
        bands = [band_of(p.priority) for p in publications]
        props = [properties(None, priority_headers(p.priority)) for p in publications]
        units = [even_units(delay_units(p.delay), b) for p, b in zip(publications, bands,
                                                                     strict=True)]
        routes = [self._route(p.queue, u, False, b) for p, u, b in zip(publications, units,
                                                                        bands, strict=True)]
        returned = self._confirms().send(
            [(exchange, key, p.body) for (exchange, key), p in zip(routes, publications,
                                                                   strict=True)], props)
        for exchange, key, body in returned:  # a queue deleted under us: declare, send again
            i = next(i for i, (r, p) in enumerate(zip(routes, publications, strict=True))
                     if r == (exchange, key) and p.body == body)
            self._forget(publications[i].queue)
            self._publish(publications[i].queue, body, props[i], units[i], band=bands[i])

    def _confirms(self) -> BatchConfirms:
        """The batch-confirming channel, opened (again) on the current connection."""
        if self._batch is None or not self._batch.is_open:
            self._batch = BatchConfirms(self._connection().channel())
        return self._batch

    def _publish(self, queue: str, body: bytes, props: BasicProperties, units: int,
                 dead: bool = False, band: int = 0) -> None:
        """One confirmed, mandatory publish; re-declares once if the queue vanished."""
        for attempt in (1, 2):
            exchange, key = self._route(queue, units, dead, band)
            try:
                self._channel("publish").basic_publish(exchange, key, body, props,
                                                       mandatory=True)
                return
            except pex.UnroutableError as exc:
                self._forget(queue)
                if attempt == 2:
                    raise BrokerError(f"RabbitMQ could not route a message to queue {queue!r} "
                                      "even after declaring it again") from exc
            except pex.NackError as exc:
                raise BrokerError(f"RabbitMQ refused to store a message for queue {queue!r} "
                                  "(basic.nack): the queue may be full or the node out of "
                                  "disk or memory; see the RabbitMQ log") from exc

    def _route(self, queue: str, units: int, dead: bool, band: int = 0) -> tuple[str, str]:
        """(exchange, routing key) for a band of `queue`, its delay ladder or its dead
        letters."""
        if units:
            return self._ensure_ladder(queue, units, band)
        self._ensure_queue(queue)
        return "", dead_queue(queue) if dead else band_queue(queue, band)

    def _republish(self, delivery: Delivery, body: bytes, delay: float,
                   headers: dict[str, Any], dead: bool = False) -> None:
        """Publish a copy of a held delivery, in its priority's band; a lost connection
        means LeaseLost, no copy."""
        props = properties(delivery.receipt.message_id,
                           {**headers, **priority_headers(delivery.priority)})
        band = 0 if dead else band_of(delivery.priority)
        units = even_units(delay_units(delay), band)
        try:
            self._attempt(lambda: self._publish(delivery.queue, body, props, units, dead,
                                                band))
        except CONNECTION_ERRORS as exc:
            self._lose_connection(f"re-publishing a delivery of queue {delivery.queue!r}", exc)
            raise LeaseLost(f"the connection to RabbitMQ was lost before the message of queue "
                            f"{delivery.queue!r} could be re-published: RabbitMQ will redeliver "
                            "the original") from exc
