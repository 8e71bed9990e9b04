"""How much work RabbitMQ queues hold: `depth`, `is_empty`, `watch`.

**Depth.** `ready`, `delayed` and `dead` are live: passive `queue.declare` of `<queue>`, of
each existing `<queue>.delay.<k>` and of `<queue>.dead` (message counts: exact, except for a
message caught in the milliseconds of a hop between two levels). Deliveries RabbitMQ pushed
into this object's prefetch buffer but nobody was handed yet count as ready. AMQP has no
unacked count, so `in_flight` comes from two sources: when every consumer of the queue is
this broker object (the passive declare gives the live consumer count; quorum queues count
a consumer that still holds deliveries after a cancel, and each held `basic.get`), this
object's own ledger is the exact, live answer; otherwise it is the management plugin's
`messages_unacknowledged`, which RabbitMQ refreshes only every few seconds (about 5-10 s
behind with default settings; a queue's first figure can take that long to appear, and
`depth` waits for it) and never below this object's own count. The management API
(`?management=http://…`, by default the AMQP host on port 15672 with the AMQP credentials)
also lists the delay levels that exist (a listing is reused for a second). If it cannot be
reached `depth` raises `BrokerError` rather than guess in-flight as 0: an autoscaler would
then scale to zero under running tasks. Enable it with
`rabbitmq-plugins enable rabbitmq_management`. `watch` polls passive declares only: a
queue nobody consumes has nothing in flight.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from conveyor.broker.base import WATCH_POLL_SECONDS, Depth
from conveyor.broker.rabbitmq.bands import bands_high_first
from conveyor.broker.rabbitmq.consumer import VANISH_SECONDS, RabbitMQConsumer
from conveyor.broker.rabbitmq.ladder import dead_queue, level_queue
from conveyor.errors import BrokerError

#: How long a management listing (delay levels, others' in-flight) is reused.
LISTING_TTL = 1.0
#: How long depth waits for a new queue's first statistics from the management plugin.
STATISTICS_WAIT = 20.0


class RabbitMQInspector(RabbitMQConsumer):
    """Depth, emptiness and `watch` (see the module docstring)."""

    def depth(self, queue: str) -> Depth:
        """Live ready/delayed/dead counts, ready and in flight summed over the priority
        bands; in-flight as described in the module docstring."""
        family = self._listing(queue)
        levels = self._delay_levels(queue, family)
        bands = bands_high_first(queue)
        self._call("settling acks before measuring depth", self._sync)
        counts = self._call(f"measuring the depth of queue {queue!r}", lambda: {
            name: self._passive(name) for name in [*bands, dead_queue(queue), *levels]})
        return Depth(ready=sum((counts[b] or (0, 0))[0] + self._buffered(b) for b in bands),
                     in_flight=sum(self._in_flight(b, counts[b], family) for b in bands),
                     delayed=sum((counts[n] or (0, 0))[0] for n in levels),
                     dead=(counts[dead_queue(queue)] or (0, 0))[0])

    def _delay_levels(self, queue: str, family: dict[str, dict[str, Any]]) -> list[str]:
        """The delay levels of `queue` that exist: the management listing's and this
        object's own."""
        prefix = f"{queue}.delay."
        levels = {n for n in family if n.startswith(prefix) and n[len(prefix):].isdigit()}
        levels |= {level_queue(queue, k) for k in self._levels.get(queue, ())}
        return sorted(levels)

    def is_empty(self, queues: Sequence[str]) -> bool:
        """False at once when this object has a delivery buffered or a queue or one of its
        delay levels holds a message (passive declares, live); only then the full `depth`.
        Its in-flight count of a queue younger than RabbitMQ's statistics interval waits for
        the management plugin's first figure (`_await_statistics`, about 5 s): a `--burst`
        worker that asked while work was still delayed stalled that long (measured: a
        rate-limited run of 10 s took 15)."""
        if any(self._buffered(q) or self._waiting(q) for q in queues):
            return False
        return super().is_empty(queues)

    def _waiting(self, queue: str) -> bool:
        """Whether `queue` or one of its delay levels (the management listing's and this
        object's own) holds a message now."""
        names = [*bands_high_first(queue), *self._delay_levels(queue, self._listing(queue))]
        counts = self._call(f"measuring the depth of queue {queue!r}",
                            lambda: [self._passive(name) for name in names])
        return any(c is not None and c[0] > 0 for c in counts)

    def _sync(self) -> None:
        """Send owed acks and take in what RabbitMQ pushed, so this object's own part of the
        counts (buffered, held) matches what the broker sees."""
        sub = self._sub
        if sub is not None and not sub.lost and sub.channel.is_open:
            self._flush(sub)
            self._pump()

    def _listing(self, queue: str, fresh: bool = False) -> dict[str, dict[str, Any]]:
        """The management API's view of the queue family, reused for up to LISTING_TTL s."""
        cached = self._listings.get(queue)
        if cached is not None and not fresh and time.monotonic() - cached[0] < LISTING_TTL:
            return cached[1]
        family = self._mgmt.queue_family(queue)
        self._listings[queue] = (time.monotonic(), family)
        return family

    def _buffered(self, queue: str) -> int:
        """Deliveries RabbitMQ pushed to this object that no one was handed yet: ready, in the
        seam's terms (nobody works on them; a crash returns them), though unacked to it."""
        sub = self._sub
        return len(sub.buffers.get(queue, ())) if sub is not None and not sub.lost else 0

    def _in_flight(self, queue: str, counts: tuple[int, int] | None,
                   family: dict[str, dict[str, Any]]) -> int:
        """In flight from one band queue: own held deliveries when every consumer is ours,
        else the management API's count (less what this object buffered, which `depth`
        reports as ready)."""
        consumers = counts[1] if counts is not None else 0
        buffered = self._buffered(queue)
        sub = self._sub
        own = sub.ledger.in_flight(queue) - buffered if sub is not None and not sub.lost else 0
        mine = sub.own_consumers(queue) if sub is not None and not sub.lost else 0
        if consumers > mine and time.monotonic() < self._vanishing_until:
            consumers = self._consumers_settling(queue, consumers, mine)
        if consumers <= mine:
            return own
        unacked = family.get(queue, {}).get("messages_unacknowledged")
        if unacked is None:
            unacked = self._await_statistics(queue, consumers)
        return max(int(unacked) - buffered, own)

    def _consumers_settling(self, queue: str, consumers: int, mine: int) -> int:
        """Re-read the consumer count while a consumer this object just settled (a held
        basic.get, a cancelled consumer) may still be counted: RabbitMQ applies the ack a
        moment after it answers a passive declare on another channel."""
        deadline = min(self._vanishing_until, time.monotonic() + VANISH_SECONDS)
        while consumers > mine and time.monotonic() < deadline:
            time.sleep(0.02)
            counts = self._call(f"measuring the depth of queue {queue!r}",
                                lambda: self._passive(queue))
            consumers = counts[1] if counts is not None else 0
        return consumers

    def _await_statistics(self, queue: str, consumers: int) -> int:
        """A queue younger than RabbitMQ's statistics interval has no unacked count yet: wait
        for the first one (a few seconds, once per queue) rather than guess."""
        deadline = time.monotonic() + STATISTICS_WAIT
        while time.monotonic() < deadline:
            time.sleep(0.5)
            unacked = self._listing(queue, fresh=True).get(queue, {}).get(
                "messages_unacknowledged")
            if unacked is not None:
                return int(unacked)
        raise BrokerError(
            f"cannot count in-flight messages of queue {queue!r}: it has {consumers} "
            "consumer(s) on other connections and RabbitMQ's management plugin published no "
            f"statistics for it within {STATISTICS_WAIT:.0f} s; check collect_statistics and "
            "the management plugin's health")

    def watch(self, queues: Sequence[str], timeout: float, *, above: int = 0) -> bool:
        """Poll live counts every WATCH_POLL_SECONDS until `queues` hold more than `above`.

        RabbitMQ cannot tell a watcher of a publish without handing the message to it, so
        this polls; but cheaply: a queue nobody consumes has nothing in flight, so its live
        ready count (a passive declare) is its whole activity and the management API is
        only asked about queues that have consumers.
        """
        deadline = time.monotonic() + timeout
        while sum(self._active(queue) for queue in queues) <= above:
            if self._interrupted.is_set():
                self._interrupted.clear()
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._interrupted.wait(min(remaining, WATCH_POLL_SECONDS))
        return True

    def _active(self, queue: str) -> int:
        counts = self._call(f"watching queue {queue!r}",
                            lambda: [self._passive(b) for b in bands_high_first(queue)])
        if any(c is not None and c[1] for c in counts):
            return self.depth(queue).active
        return sum(c[0] for c in counts if c is not None)
