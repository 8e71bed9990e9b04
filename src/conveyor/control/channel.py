"""The control channel: how a cancel reaches every worker within a second.

One `Channel` per kind of server, chosen from the broker's URL (`for_broker.for_broker`):

* Redis (and kombu+redis): pub/sub on `<prefix>:control`;
* Postgres: LISTEN/NOTIFY on `conveyor_control_<schema>`;
* RabbitMQ (and kombu+amqp): a fanout exchange, each worker reading it through an
  exclusive queue of its own that RabbitMQ deletes when the worker's connection ends;
* the embedded SQLite broker and other kombu transports: a short poll of the records
  (`Poll`, 4 a second): on SQLite the workers are local and the read is a file read.

A channel carries ids only; the durable record is written first (`Client.cancel`), so a
worker that was not listening (down, partitioned, reconnecting) finds it when it reads the
records again (`watch.CancelWatch`) or when the message is delivered.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.limits import Limiter

#: How often `Poll` reads the records (seconds).
POLL_INTERVAL = 0.25


class Subscription(abc.ABC):
    """One worker's open subscription; its connection is its own."""

    @abc.abstractmethod
    def next(self, timeout: float) -> list[str]:
        """The ids announced since the last call, waiting up to `timeout` for one; raises
        (any error) when the connection is lost: the caller subscribes again."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection."""


class Channel(abc.ABC):
    """Announces cancelled ids to every subscribed worker."""

    @abc.abstractmethod
    def announce(self, message_id: str) -> None:
        """Tell every listening worker that `message_id` was cancelled (its record is
        written already)."""

    @abc.abstractmethod
    def subscribe(self) -> Subscription:
        """Start listening: what is announced from now on comes through `next`."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the publishing connection, if any."""


class Poll(Channel):
    """No server to carry it: the subscriber reads the records made since its last read."""

    def __init__(self, open_records: Callable[[], Limiter]) -> None:
        self._open = open_records

    def announce(self, message_id: str) -> None:
        return  # the record is the announcement

    def close(self) -> None:
        return  # the records' store is its opener's

    def subscribe(self) -> Subscription:
        return _Polling(self._open())


class _Polling(Subscription):
    def __init__(self, records: Limiter) -> None:
        self._records = records
        self._since = time.time()

    def next(self, timeout: float) -> list[str]:
        time.sleep(min(timeout, POLL_INTERVAL))
        now = time.time()
        # records made by another process stamp their own clock: read a second back
        found = self._records.cancels(now, self._since - 1.0)
        self._since = now
        return found

    def close(self) -> None:
        self._records.close()
