"""The broker seam: the one interface every component talks to queues through.

A transport is one module implementing `Broker`. The semantics every transport keeps are
written down once, here, and checked by one conformance suite (`tests/contract/`):

* at-least-once: a delivery stays owned by its consumer until `ack`, `retry_later` or
  `dead_letter`; if the consumer dies (process killed, connection lost, lease expired) the
  message is delivered again;
* a delivery is never handed to a second consumer while its lease is alive
  (`extend_lease` is the heartbeat);
* `Delivery.delivery_count` grows on every delivery of the same message, so a poison message
  can be dead-lettered after N deliveries;
* delayed messages are stored on the broker, never in a consumer's memory, and never
  delivered early;
* higher `priority` first within a queue, where the transport supports it;
* consumption blocks on the broker: an idle consumer costs ~0 CPU, and a published message
  reaches a waiting consumer in milliseconds.

Admin operations (listing and re-queueing dead letters, purging) are on the same class but
kept apart at the bottom: workers never need them, operators and tests do. Callers above the
broker layer depend on the narrow role they use (`roles.py`: producer, consumer, inspector,
administrator), never on this whole class.
"""

from __future__ import annotations

import abc
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import LeaseLost

DEFAULT_LEASE_SECONDS = 60.0
log = logging.getLogger("conveyor.broker")
#: How often the default `watch` reads depth: far below any autoscaler's polling interval.
WATCH_POLL_SECONDS = 0.25


@dataclass
class Delivery:
    """A message claimed by this consumer. `receipt` is the transport's own handle."""

    queue: str
    body: bytes
    delivery_count: int
    receipt: Any = field(repr=False)
    priority: int = 0
    #: When (time.monotonic(), this process) its lease lapses at the earliest: the claim or
    #: the last renewal was *sent* at `lease_until - lease_seconds`, so the broker's own
    #: lease, started when the request arrived, lapses no sooner. On RabbitMQ, when the
    #: broker may close the connection it came on at the earliest, as the transport proves
    #: it (broker/rabbitmq/liveness.py); infinite where nothing lapses by time (kombu, or
    #: a RabbitMQ connection without heartbeats). A worker stops its runner before this
    #: passes (worker/fencing.py).
    lease_until: float = field(default=math.inf, repr=False)


@dataclass(frozen=True)
class Publication:
    """One message for `Broker.publish_many`: what `publish` takes, as a value."""

    queue: str
    body: bytes
    priority: int = 0
    delay: float = 0.0


@dataclass(frozen=True)
class Depth:
    """How much work a queue holds, split the way an autoscaler needs it."""

    ready: int
    in_flight: int
    delayed: int
    dead: int

    @property
    def active(self) -> int:
        """Work that needs a worker now or is on one: what scaling decisions count."""
        return self.ready + self.in_flight


@dataclass(frozen=True)
class DeadLetter:
    """A quarantined message: its body untouched, and why it was set aside."""

    id: str
    queue: str
    body: bytes
    reason: str
    dead_at: float
    delivery_count: int


class Broker(abc.ABC):
    """One small interface over SQLite, Postgres, Redis and RabbitMQ.

    Deliveries returned by `consume` belong to the broker object that yielded them; ack,
    retry, dead-letter and extend them on that same object. `wakeup()` is the only method
    that may be called from another thread: it makes a blocked `consume` step return `None`
    promptly, so a supervisor can react to its own events without polling.
    """

    #: Whether `priority` orders deliveries within a queue on this transport.
    supports_priority: bool = True
    #: A one-line caveat printed at start for guarantees this transport cannot keep.
    weaker_guarantees: str = ""
    #: Whether a delivery is held by a lease that lapses by time, the consumer alive or not
    #: (Redis, Postgres, SQLite): then its `lease_until` is kept (see `Delivery`).
    leases: bool = False

    @property
    def fence_seconds(self) -> float:
        """The lease a worker's self-fencing reckons with (worker/fencing.py): `lease_seconds`
        where leases lapse by time; a transport that stamps `lease_until` itself (RabbitMQ)
        says how long its own lasts; infinite where nothing lapses by time (kombu)."""
        return self.lease_seconds if self.leases else math.inf

    def __init__(self, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        self.lease_seconds = lease_seconds
        self._outstanding = 0
        self._outstanding_lock = threading.Lock()
        self._interrupted = threading.Event()
        #: a transport's Reconnect(stopping=...): set by stop_retrying()
        self._stopping = threading.Event()
        self._paused = False
        self._prefetch = 1
        self._ahead = 0  # see consume()
        self._unhanded: list[Delivery] = []   # claimed by consume, not yet handed out

    # -- the seam -----------------------------------------------------------------------

    @abc.abstractmethod
    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        """Store `body` on `queue`, durably, deliverable after `delay` seconds."""

    def publish_many(self, publications: Sequence[Publication]) -> None:
        """Store every publication durably before returning, as `publish` does each.

        Transports that can send many in one round trip override this (a mover such as the
        Celery intake publishes in batches); a failure part way may have stored some of
        them, and a retry after a lost connection may store some twice (at-least-once).
        """
        for p in publications:
            self.publish(p.queue, p.body, priority=p.priority, delay=p.delay)

    def consume(self, queues: Sequence[str], *, prefetch: int = 1, timeout: float = 1.0,
                ahead: int = 0) -> Generator[Delivery | None, float | None, None]:
        """Yield deliveries from `queues` (first listed first when several have work).

        At most `prefetch` deliveries are held (yielded and not yet settled) at once; a step
        that cannot hand one out within `timeout` seconds, or that `wakeup()` interrupts,
        yields `None`. `steps.send(t)` takes one step with timeout `t` instead (0: claim
        if something is ready, never wait). Transports supply `_claim` and `_wait`; this
        loop is shared.

        `ahead`: a transport whose server pushes deliveries (RabbitMQ) may let it push up to
        `ahead` more than `prefetch` into this object's buffer, so the next delivery is
        already here when a held one is settled, instead of one round trip later. They are
        not handed out before then, count as ready in `depth`, and go back on `pause()`,
        `close()` or a lost connection. A transport that claims (Postgres) may take up to
        `ahead` more in one claim (`_reads_ahead`): leased to this consumer and buffered
        here, they are handed out without a round trip, renewed by `renew_claimed`, and go
        back on `give_back_claimed()` or `close()`. The cost: a message waits behind this
        consumer's running work while another consumer may be idle. Others ignore it.
        """
        self._prefetch = prefetch
        self._ahead = ahead
        self._start_consuming(queues, prefetch)
        buffered: list[Delivery] = []
        self._unhanded = buffered
        try:
            yield from self._steps(queues, prefetch, timeout, buffered)
        finally:
            self._return_unhanded(buffered)

    def _steps(self, queues: Sequence[str], prefetch: int, timeout: float,
               buffered: list[Delivery]) -> Generator[Delivery | None, float | None, None]:
        step_timeout: float | None = None
        while True:
            deadline = time.monotonic() + (timeout if step_timeout is None else step_timeout)
            if buffered and (due := self.owed_for) is not None and due <= 0:
                self.send_owed()  # no claim this step to carry them
            while not buffered:
                if self.outstanding < prefetch and not self._paused:
                    free = prefetch - self.outstanding
                    since = time.monotonic()
                    buffered.extend(self._leased(
                        self._claim(queues, free + self._reads_ahead()), since))
                    if buffered:
                        break
                remaining = deadline - time.monotonic()
                if self._interrupted.is_set() or remaining <= 0:
                    break
                self._wait(queues, remaining)
            self._interrupted.clear()
            if buffered:
                self._held(1)
                step_timeout = yield buffered.pop(0)
            else:
                step_timeout = yield None

    def claim_more(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Take up to `limit` more deliveries now, beyond `prefetch`, without waiting.

        For a worker whose limiter found a key full (worker/flow.py): the queue then likely
        holds many more messages of that key, and parking them a batch at a time (one
        limiter transaction) instead of one per claim is what lets another key's message
        behind them start soon. They are held like `consume`'s deliveries: settle each.
        Transports that cannot take several at once return what they can (perhaps none).
        """
        got: list[Delivery] = []
        while len(got) < limit and not self._paused:
            since = time.monotonic()
            more = self._leased(self._claim(queues, limit - len(got)), since)
            if not more:
                break
            got += more
        self._held(len(got))
        return got

    @property
    def claimed_ahead(self) -> int:
        """Deliveries `consume` claimed and has not handed out yet: a consumer that settles
        in batches takes them with `steps.send(0)`, which then claims nothing new."""
        return len(self._unhanded)

    def renew_claimed(self, seconds: float | None = None) -> None:
        """Extend the leases of deliveries `consume` claimed and has not handed out yet.

        A consumer that claims in batches with a short lease (the scheduler) calls this while
        it is alive, so a live consumer keeps its batch and a killed one's batch comes back
        as soon as the short lease runs out. One whose lease was already lost is dropped: it
        is someone else's now. Transports without leases make `extend_lease` a no-op.
        """
        for delivery in list(self._unhanded):
            since = time.monotonic()
            try:
                self.extend_lease(delivery, seconds)
            except LeaseLost:
                self._unhanded.remove(delivery)
            else:
                self._leased([delivery], since, seconds)

    def _leased(self, deliveries: list[Delivery], since: float,
                seconds: float | None = None) -> list[Delivery]:
        """Stamp `deliveries` claimed or renewed by a request sent at `since` with when
        their lease lapses at the earliest (`Delivery.lease_until`), where leases lapse."""
        if self.leases:
            for delivery in deliveries:
                delivery.lease_until = since + (seconds or self.lease_seconds)
        return deliveries

    def give_back_claimed(self) -> None:
        """Give back at once what `consume` claimed and has not handed out (a draining
        worker), so other consumers run it now instead of after this one stops."""
        buffered = list(self._unhanded)
        self._unhanded.clear()  # the consume loop's own list: it hands none of them out
        self._return_unhanded(buffered)

    def _return_unhanded(self, buffered: list[Delivery]) -> None:
        """A consume loop dropped with claims it never handed out returns them at once,
        instead of leaving them leased until their lease expires."""
        for delivery in buffered:
            self._held(1)
            try:
                self.retry_later(delivery, 0.0)
            except Exception as exc:  # noqa: BLE001 - best effort: the lease still expires
                log.warning("could not give back an unused delivery from %s (%s); it returns "
                            "when its lease expires", delivery.queue, exc)

    def _reads_ahead(self) -> int:
        """How many deliveries beyond its free slots a consume step claims (see `consume`'s
        `ahead`); 0 unless the transport claims in batches."""
        return 0

    def _may_claim(self) -> bool:
        """Whether the consume loop would claim now: a `_wait` that says no should sleep
        until woken, not until the next due message (which it could not take anyway)."""
        return self.outstanding < self._prefetch and not self._paused

    def pause(self, *, wake: bool = True) -> None:
        """Stop claiming new deliveries (a draining worker); held ones stay ours to settle.
        `wake=False`: the caller has a blocked step woken itself (`wakeup()` may wait on an
        unreachable broker: a signal handler's thread must not)."""
        self._paused = True
        if wake:
            self.wakeup()

    def _start_consuming(self, queues: Sequence[str], prefetch: int) -> None:
        """Hook: subscribe, declare, or listen before the first claim."""
        return None

    @abc.abstractmethod
    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Take up to `limit` deliveries now, without waiting; first listed queue first."""

    @abc.abstractmethod
    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """Block until work may be available, `wakeup()` is called, or `timeout` passes."""

    @abc.abstractmethod
    def ack(self, delivery: Delivery) -> None:
        """The work is done: remove the message for good."""

    def ack_soon(self, delivery: Delivery) -> None:
        """ack(), where a transport can, without waiting for the server's answer: a worker's
        ack then shares its round trip with whatever the worker sends next (its next
        claim). A lease lost by then is logged when the answer arrives, not raised: use
        ack() where the caller must know. By default this is ack()."""
        self.ack(delivery)

    @property
    def owed_for(self) -> float | None:
        """Seconds until the acks `ack_soon` deferred are due to be sent (0 or less: now),
        None when none is owed. A transport that defers them to its next claim sends them
        by then: the consume loop before it hands out a delivery claimed earlier or waits;
        a consumer that stops stepping it (its slots are full) calls `send_owed` when due,
        so no ack waits longer than that on its next step."""
        return None

    def send_owed(self) -> bool:
        """Send the acks `ack_soon` deferred, now; False if `wakeup()` interrupted it while
        the broker was away (they stay owed)."""
        return True

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[Delivery]:
        """ack() each, in one round trip where the transport can (a worker acks a batch it
        parked together); those known to be no longer ours (LeaseLost) are returned, not
        raised. By default `ack_soon` each, whose lost leases may only be logged later."""
        lost = []
        for delivery in deliveries:
            try:
                self.ack_soon(delivery)
            except LeaseLost:
                lost.append(delivery)
        return lost

    @abc.abstractmethod
    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        """Give the message back, deliverable after `delay`; `body` replaces it if given."""

    @abc.abstractmethod
    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Quarantine the message with a reason people can read; it is never retried."""

    @abc.abstractmethod
    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        """Heartbeat: keep the delivery ours for `seconds` (default `lease_seconds`) more."""

    @abc.abstractmethod
    def depth(self, queue: str) -> Depth:
        """Ready, in-flight, delayed and dead counts of one queue."""

    def peek(self, queue: str, limit: int) -> list[bytes] | None:
        """The bodies of up to `limit` ready messages of `queue`, first to be delivered
        first, claiming nothing; None where the transport cannot look without taking them
        (RabbitMQ, kombu). The autoscaler reads which limits the head of a queue carries."""
        return None

    def is_empty(self, queues: Sequence[str]) -> bool:
        """Whether `queues` hold no message ready, in flight or delayed (dead ones aside):
        a `--burst` worker's test for being done, asked whenever it is idle.

        This default reads `depth`; a transport whose in-flight count is slow to learn
        answers False from its cheap counts first, so an idle burst worker never waits on
        that count while work is ready or delayed.
        """
        return all(d.active + d.delayed == 0 for d in map(self.depth, queues))

    def watch(self, queues: Sequence[str], timeout: float, *, above: int = 0) -> bool:
        """Wait until `queues` together hold more than `above` messages ready or in flight.

        True as soon as they do (at once if they already do); False when `timeout` passes or
        `wakeup()` interrupts. For an autoscaler whose workers are at zero: it must learn of
        new work at once, yet never claim a message or take a wake-up meant for a consumer.
        This default reads `depth` every `WATCH_POLL_SECONDS`; transports that can be told
        of a publish without taking it from a consumer override it. Use a broker object of
        its own for watching: a transport may set up a listener on it.
        """
        return self._watch_depth(queues, timeout, above, self._poll_depth_sleep)

    def _watch_depth(self, queues: Sequence[str], timeout: float, above: int,
                     sleep: Callable[[Sequence[str], float], None]) -> bool:
        """`watch`'s loop: read depth, then `sleep(queues, remaining)` until it is over."""
        deadline = time.monotonic() + timeout
        while sum(self.depth(q).active for q in queues) <= above:
            if self._interrupted.is_set():
                self._interrupted.clear()
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            sleep(queues, remaining)
        return True

    def _poll_depth_sleep(self, queues: Sequence[str], timeout: float) -> None:
        self._interrupted.wait(min(timeout, WATCH_POLL_SECONDS))

    def hold_connections_with(self, hold: Callable[[socket.socket], None]) -> None:
        """Call `hold` with every connection whose close hands this consumer's deliveries to
        another at once (now, and each time one is opened), so a worker can keep it open
        until its runners are gone (`Pool.hold`). Transports whose redelivery waits for a
        lease to lapse have none: the lease outlasts any runner of a dead worker."""
        return

    def stop_retrying(self, *, wake: bool = True) -> None:
        """The process stops at once (a worker's cold stop): a call retrying an unreachable
        broker gives up at its next pause, and later ones after their first failed attempt,
        raising BrokerConnectionError. Thread-safe. Transports without retries ignore it.
        `wake=False`: as for `pause`."""
        self._stopping.set()
        if wake:
            self.wakeup()

    def wakeup(self) -> None:
        """Make a blocked `consume` step return `None` soon. Thread-safe."""
        self._interrupted.set()
        self._interrupt_wait()

    @abc.abstractmethod
    def _interrupt_wait(self) -> None:
        """Make a blocked `_wait` return now. Called from any thread."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Unsettled deliveries go back to the queue."""

    # -- admin: operators and tests, not workers -----------------------------------------

    def dead_queues(self) -> list[str]:
        """The queues holding dead letters now, sorted, whoever consumes them (or nobody):
        an operator must see every one without knowing its name. A transport that cannot
        list its queues raises BrokerError saying so (kombu), and the readers warn that
        their listing is partial."""
        return []

    @abc.abstractmethod
    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """The oldest `limit` dead letters of `queue`."""

    @abc.abstractmethod
    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Put dead letters (all, or those in `ids`) back on their queue; return how many."""

    @abc.abstractmethod
    def purge(self, queue: str) -> int:
        """Delete every message of `queue` (ready, delayed and dead); return how many."""

    @abc.abstractmethod
    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters of `queue` (all, or those in `ids`); return how many."""

    # -- shared bookkeeping ----------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Deliveries yielded by `consume` and not yet settled."""
        return self._outstanding

    def _held(self, n: int) -> None:
        with self._outstanding_lock:
            self._outstanding += n

    def _settled(self) -> None:
        with self._outstanding_lock:
            self._outstanding = max(0, self._outstanding - 1)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
