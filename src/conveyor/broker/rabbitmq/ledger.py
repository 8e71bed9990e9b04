"""Consumer bookkeeping: receipts of held deliveries, and coalesced acks.

**Acks** are coalesced: every ack is a Raft command on a quorum queue, and acking a whole
prefetch window with one `basic.ack(multiple=True)` drains several times faster than acking
each message. Acks owed are sent when a window's worth is owed; when the window is full and
the consumer is about to block (RabbitMQ sends nothing more until they arrive); after
`ACK_DELAY` (5 ms) with nothing left to hand out; by a consumer reading ahead (a worker),
with its next claim, so what it settled in one wake-up goes as one; and before
`extend_lease`, `depth` and `close`. A run of consecutive delivery tags goes as one multiple
ack, the rest singly. `retry_later` and `dead_letter` send at once. An ack that never
reached a broker that died just means a redelivery (at-least-once).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pika.adapters.blocking_connection import BlockingChannel

from conveyor.broker.base import Delivery


@dataclass
class Receipt:
    """What settling a delivery needs: its channel generation, tag and consumer identity."""

    epoch: int
    tag: int
    consumer: str
    message_id: str | None
    done: bool = False


class AckLedger:
    """The delivery tags of one channel that RabbitMQ still counts as unacknowledged.

    `owed` tags are settled here but their ack is not sent yet. `flush` sends a run of
    consecutive resolved tags just above `floor` as one `basic.ack(multiple=True)` and the
    rest one by one. Tags are consecutive per channel (every deliver and get-ok takes the
    next), so a tag this ledger has not seen stops the run: it may be a delivery pika has not
    dispatched yet, which multiple=True would ack unprocessed. The exception is a tag below the
    highest consumer delivery dispatched: pika dispatches in tag order, so such a tag was
    rejected by pika itself when a consumer was cancelled.
    """

    def __init__(self) -> None:
        self.floor = 0
        self.unacked: dict[int, tuple[str, str]] = {}  # tag -> (queue, consumer identity)
        self.owed: set[int] = set()
        self.resolved: set[int] = set()
        self.dispatched = 0
        self._held: Counter[str] = Counter()  # consumer identity -> its unacked tags

    def add(self, tag: int, queue: str, consumer: str, pushed: bool) -> None:
        self.unacked[tag] = (queue, consumer)
        self._held[consumer] += 1
        if pushed:
            self.dispatched = max(self.dispatched, tag)

    def _remove(self, tag: int) -> None:
        entry = self.unacked.pop(tag, None)
        if entry is not None:
            self._held[entry[1]] -= 1
            if not self._held[entry[1]]:
                del self._held[entry[1]]

    def held_by(self, consumer: str) -> int:
        """Unacked deliveries of one consumer (what counts against its prefetch)."""
        return self._held[consumer]

    def settle(self, tag: int) -> None:
        if tag in self.unacked:
            self.owed.add(tag)

    def drop(self, tag: int) -> None:
        """The tag was nacked: it no longer counts, and a run may pass over it."""
        self._remove(tag)
        self.owed.discard(tag)
        self.resolved.add(tag)

    def _passable(self, tag: int) -> bool:
        if tag in self.owed or tag in self.resolved:
            return True
        return tag not in self.unacked and tag < self.dispatched

    def flush(self, send: Callable[[int, bool], None]) -> None:
        """Send every owed ack: the run above `floor` as one, the others singly."""
        if not self.owed:
            return
        tag = self.floor + 1
        run: list[int] = []
        while self._passable(tag):
            if tag in self.owed:
                run.append(tag)
            tag += 1
        if run:
            send(run[-1], len(run) > 1)
        for done in range(self.floor + 1, tag):
            self._remove(done)
            self.owed.discard(done)
            self.resolved.discard(done)
        self.floor = max(self.floor, tag - 1)
        for single in sorted(self.owed):
            send(single, False)
            self._remove(single)
            self.resolved.add(single)
        self.owed.clear()

    def in_flight(self, queue: str) -> int:
        return sum(1 for q, _ in self.unacked.values() if q == queue)

    def consumers(self, queue: str) -> set[str]:
        return {c for q, c in self.unacked.values() if q == queue}


@dataclass
class Subscription:
    """One consuming channel: its consumers, what they delivered, and the acks owed."""

    channel: BlockingChannel
    epoch: int
    queues: list[str] = field(default_factory=list)
    prefetch: int = 1  # the qos window: what may be held plus what may be read ahead
    ahead: int = 0
    tags: dict[str, str] = field(default_factory=dict)  # queue -> consumer tag
    buffers: dict[str, deque[Delivery]] = field(default_factory=dict)
    ledger: AckLedger = field(default_factory=AckLedger)
    lost: bool = False
    cancelled: bool = False
    #: Priority bands (above 0) that sent us a message since a look found them empty.
    busy: set[str] = field(default_factory=set)

    @property
    def credit_left(self) -> bool:
        """Whether RabbitMQ may still push: owed acks count against prefetch until sent."""
        return len(self.ledger.unacked) < self.prefetch

    def own_consumers(self, queue: str) -> int:
        """How many of the queue's consumers RabbitMQ would count for this channel."""
        ids = self.ledger.consumers(queue)
        if queue in self.tags:
            ids.add(self.tags[queue])
        return len(ids)
