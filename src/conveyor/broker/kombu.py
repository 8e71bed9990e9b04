"""kombu transport: Conveyor on any broker kombu reaches (`kombu+<transport>://…`).

`kombu+redis://host:6379/0`, `kombu+amqp://user:pass@host//`, `kombu+sqs://…`: everything
after `kombu+` is an ordinary kombu URL. This transport exists for brokers Conveyor has no
native transport for; on Redis and RabbitMQ prefer the native ones, which keep every
guarantee of `conveyor.broker.base`. It speaks only kombu's portable API (`Connection`,
`Producer`, `Consumer`, `Queue.get`, `queue_declare`/`queue_purge`), never a transport's
internals, so what kombu cannot express is named here instead of faked:

* **Priorities** are ignored (`supports_priority = False`): kombu maps them differently per
  transport (Redis counts 0 as highest, AMQP needs `x-max-priority`).
* **Redelivery after a crash** is the transport's own. On AMQP it is connection-bound, as
  native: a killed consumer's messages come back at once. On kombu's virtual transports
  (Redis, SQS, SQLAlchemy, …) an unacknowledged message comes back only after the
  transport's *visibility timeout* (`?visibility_timeout=`, kombu's default 3600 s), and a
  delivery held longer than that is handed to another consumer although its worker is alive
  and heartbeating: `extend_lease` cannot renew it through kombu's API.
* **Delivery counts** after a crash: kombu says only whether a message was `redelivered`,
  not how often, so a message that crashed its consumer several times counts as one extra
  delivery. Counts carried through `retry_later` are exact (a header).
* **Delays are emulated**: a delayed message waits in one of the queue's delay levels
  `<queue>.delay.<k>` (level k holds delays of 2**k to 2**(k+1) s; level 0 under 2 s; the
  top level everything longer), stamped with its due time. Consumers look at the levels of
  the queues they consume, up to `LEVEL_SCAN` messages per look: due ones move to the queue,
  the others walk down a level as their remaining time shrinks, and the next look is timed
  by the earliest of them; a level that was empty is looked at again after max(1 s,
  2**(k-2) s), since another process may have published into it. So a delayed message is
  stored on the broker and never early (publisher and consumer clocks must agree: NTP), but
  may be late by up to max(1 s, a quarter of its delay), by up to its delay again when a
  level holds more than `LEVEL_SCAN` messages, and an idle consumer makes about four broker
  round trips a second per queue.
* **In-flight depth** counts only this broker object's own deliveries: AMQP and kombu have
  no portable unacknowledged count, so an autoscaler reading another process's depth sees 0.

Layout per queue: `<queue>`, `<queue>.dead` (dead letters: reason, time and count in
headers), `<queue>.delay.0…16`; every name gets the URL's `?prefix=` (on Redis it becomes
kombu's `global_keyprefix`, so kombu's own bookkeeping keys get it too). A consuming broker also
has a private wake queue (`conveyor.wake.<id>`) that `wakeup()` publishes to through a
second connection, so a blocked consume returns at once on every transport.

`?queue_expires=N` (seconds) declares every queue with `x-expires`: a queue nobody has used
for N seconds is deleted, messages and all. It is for tests and scratch namespaces only.

Connection loss: calls retry with backoff (`broker/reconnect.py`) for `?retry_seconds=`
(default 60) and then raise `BrokerConnectionError`; a consumer reconnects and re-subscribes
on its next step, for as long as the outage lasts. Deliveries held from a lost connection
raise `LeaseLost` when settled.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import kombu
from kombu import Consumer, Exchange, Producer, Queue
from kombu.exceptions import OperationalError
from kombu.message import Message as KombuMessage

from conveyor.broker import positive_option
from conveyor.broker.base import DEFAULT_LEASE_SECONDS, Broker, DeadLetter, Delivery, Depth
from conveyor.broker.reconnect import (
    DEPRECATED_RETRY_OPTION,
    RETRY_OPTION,
    Backoff,
    Reconnect,
    one_line,
    quiet_library_loggers,
    retry_seconds,
)
from conveyor.errors import BrokerError, ConfigError, LeaseLost
from conveyor.locations import redact

log = logging.getLogger("conveyor.broker.kombu")
quiet_library_loggers("kombu", "amqp")
T = TypeVar("T")

ID_HEADER = "x-conveyor-id"
DELIVERIES_HEADER = "x-conveyor-deliveries"
DUE_HEADER = "x-conveyor-due"
REASON_HEADER = "x-conveyor-reason"
DEAD_AT_HEADER = "x-conveyor-dead-at"
#: Delay levels 0..TOP_LEVEL; level k >= 1 holds delays of [2**k, 2**(k+1)) seconds.
TOP_LEVEL = 16
#: Shortest pause between two looks at an empty delay level.
LEVEL_POLL = 1.0
#: Messages one look at a delay level examines (the rest wait for the next look).
LEVEL_SCAN = 100
#: How long `depth` waits for deliveries already on their way to this consumer.
SETTLE = 0.05
#: Transports whose unacknowledged deliveries return when the connection drops.
CONNECTION_BOUND = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})
REDIS = frozenset({"redis", "rediss"})
OPTIONS = ("prefix", "visibility_timeout", RETRY_OPTION, DEPRECATED_RETRY_OPTION,
           "queue_expires")


# -- configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """A parsed `kombu+…` URL: kombu's own URL plus Conveyor's options."""

    url: str
    transport: str
    prefix: str
    where: str
    retry_seconds: float
    transport_options: dict[str, Any] = field(default_factory=dict)
    queue_arguments: dict[str, Any] = field(default_factory=dict)


def parse_url(url: str) -> Settings:
    """Strip `kombu+` and Conveyor's query options; kombu gets the rest untouched."""
    if not url.lower().startswith("kombu+") or "://" not in url:
        raise ConfigError(f"kombu broker URL {redact(url)!r} must look like "
                          "kombu+<transport>://…, e.g. kombu+redis://127.0.0.1:6379/0")
    parts = urlsplit(url[len("kombu+"):])
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in OPTIONS}
    rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query
                                                      if k not in OPTIONS])))
    options: dict[str, Any] = {}
    if "visibility_timeout" in ours:
        options["visibility_timeout"] = positive_option(ours, "visibility_timeout", 0.0, url)
    transport = parts.scheme.lower()
    prefix = ours.get("prefix", "")
    if transport in CONNECTION_BOUND:
        options["confirm_publish"] = True  # publish returns once the broker has the message
    if transport in REDIS and prefix:  # kombu prefixes every key, its bookkeeping too
        options["global_keyprefix"], prefix = prefix, ""
    expires = positive_option(ours, "queue_expires", 0.0, url)
    return Settings(url=rest, transport=transport, prefix=prefix,
                    where=redact(url.split("?", 1)[0]),
                    retry_seconds=retry_seconds(ours, url),
                    transport_options=options,
                    queue_arguments={"x-expires": int(expires * 1000)} if expires else {})


def level_of(seconds: float) -> int:
    """The delay level that holds a message `seconds` from due."""
    return 0 if seconds < 2 else min(int(math.log2(seconds)), TOP_LEVEL)


def level_floor(level: int) -> float:
    """Remaining time below which a message leaves `level` for a lower one."""
    return 0.0 if level == 0 else float(2 ** level)


def describe_limits(transport: str, visibility_timeout: float) -> str:
    """The one line `conveyor worker` prints at start: what this transport cannot keep."""
    crash = ("a killed consumer's messages return at once, but a message redelivered after "
             "crashes counts as one extra delivery however often it crashed"
             if transport in CONNECTION_BOUND else
             f"a killed consumer's messages return only after the {visibility_timeout:g} s "
             "visibility timeout, and a task running longer than that is redelivered "
             "while it runs")
    return (f"kombu+{transport}: priorities are ignored; {crash}; delays are polled "
            "delay levels (never early, up to max(1 s, a quarter of the delay) late); "
            "in-flight depth counts only this process's deliveries")


# -- deliveries ----------------------------------------------------------------------------


@dataclass(eq=False)
class Receipt:
    """Which connection a delivery came on: settling it on a newer one is impossible."""

    message: KombuMessage
    queue: str
    epoch: int
    done: bool = False


def _header_int(headers: dict[str, Any], name: str) -> int:
    try:
        return int(headers.get(name) or 0)
    except (TypeError, ValueError):
        return 0


def _header_float(headers: dict[str, Any], name: str) -> float:
    try:
        return float(headers.get(name) or 0.0)
    except (TypeError, ValueError):
        return 0.0


def delivery_count(message: KombuMessage) -> int:
    """Deliveries so far: carried ones, this one, and one more if kombu says redelivered."""
    headers = message.headers or {}
    redelivered = bool((message.delivery_info or {}).get("redelivered"))
    return _header_int(headers, DELIVERIES_HEADER) + 1 + int(redelivered)


# -- the broker ----------------------------------------------------------------------------


class KombuBroker(Broker):
    """The broker seam over kombu's portable API; see the module docstring for its limits."""

    supports_priority = False

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self.settings = parse_url(url)
        transport = self.settings.transport
        visibility = float(self.settings.transport_options.get("visibility_timeout", 3600))
        #: Guarantees of the conformance suite this transport cannot keep, with the reason.
        self.unsupported: dict[str, str] = {}
        if transport not in CONNECTION_BOUND:
            self.unsupported["crash_redelivery"] = (
                f"kombu's {transport} transport returns a killed consumer's messages only "
                f"after its visibility timeout ({visibility:g} s), not when the consumer dies")
        self.weaker_guarantees = describe_limits(transport, visibility)
        self._lock = threading.Lock()  # guards the wake-up connection only
        self._waker: kombu.Connection | None = None
        self._waker_owner: int | None = None
        self._epoch = 0
        self._conn: kombu.Connection | None = None
        self._declared: set[str] = set()
        self._want: tuple[tuple[str, ...], int] | None = None
        self._sub: Subscription | None = None
        self._chans: Channels | None = None
        self._next_look: dict[tuple[str, int], float] = {}
        self._backoff = Backoff()  # the consumer's, carried across its steps
        self._live: set[Receipt] = set()  # deliveries handed out and not settled
        self._loop: object | None = None  # the consume loop now running
        self._closed = False
        try:
            probe = kombu.Connection(self.settings.url)  # never connected: names the errors
            #   (and resolves the transport: an unknown one is a KeyError)
        except KeyError as exc:   # kombu's "No such transport: nope"
            raise ConfigError(f"broker URL {self.settings.where!r}: kombu has no transport "
                              f"{exc.args[0].rsplit(': ', 1)[-1]!r}; e.g. kombu+redis://, "
                              "kombu+amqp://, kombu+sqs://") from None
        #: What a reconnect may fix; channel errors (a refused declare) it would not.
        self._errors: tuple[type[BaseException], ...] = (
            *probe.recoverable_connection_errors, OperationalError, ConnectionError, OSError)
        self._refusals: tuple[type[BaseException], ...] = tuple(probe.channel_errors)
        self._reconnect = Reconnect(f"the kombu broker {self.settings.where}", log,
                                    self._is_loss, self.settings.retry_seconds)
        self._call("connecting", self._connection)

    # -- names and connections ---------------------------------------------------------

    def _name(self, queue: str, suffix: str = "") -> str:
        return f"{self.settings.prefix}{queue}{suffix}"

    def _level_name(self, queue: str, level: int) -> str:
        return self._name(queue, f".delay.{level}")

    def _connection(self) -> kombu.Connection:
        if self._conn is None:
            conn = kombu.Connection(self.settings.url, connect_timeout=5,
                                    transport_options=dict(self.settings.transport_options))
            conn.ensure_connection(max_retries=1)
            self._conn, self._declared = conn, set()
            self._channel = conn.channel()
            self._producer = Producer(self._channel, exchange=Exchange(""))
        return self._conn

    def _drop(self) -> None:
        """Forget the connection (it failed or is closing).

        Deliveries held from it are no longer ours (the broker redelivers them): they stop
        counting against prefetch at once, and settling one raises LeaseLost.
        """
        conn, self._conn, self._sub, self._chans = self._conn, None, None, None
        self._epoch += 1
        for receipt in list(self._live):
            self._release(receipt)
        if conn is not None:
            try:
                conn.release()
            except Exception as exc:  # closing a broken connection may fail in many ways
                log.debug("closing a kombu connection: %r", exc)

    def _is_loss(self, exc: BaseException) -> bool:
        return isinstance(exc, self._errors) and not isinstance(exc, self._refusals)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()`, reconnecting with backoff for up to `retry_seconds`."""
        def attempt() -> T:
            try:
                self._connection()
                return fn()
            except self._refusals as exc:
                self._drop()
                raise BrokerError(f"{self.settings.where} refused {what}: {exc}") from exc
            except self._errors:
                self._drop()
                raise
        return self._reconnect.call(what, attempt)

    def _declare(self, name: str) -> int:
        """Declare a durable queue (idempotent); its ready-message count."""
        ok = self._channel.queue_declare(queue=name, durable=True, auto_delete=False,
                                         arguments=self.settings.queue_arguments or None)
        self._declared.add(name)
        return int(ok.message_count or 0)

    def _send(self, name: str, body: bytes, headers: dict[str, Any]) -> None:
        if name not in self._declared:
            self._declare(name)
        self._producer.publish(body, exchange="", routing_key=name, headers=headers,
                               delivery_mode=2, content_type="application/octet-stream",
                               content_encoding="binary")

    # -- publishing ----------------------------------------------------------------------

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        headers = {ID_HEADER: uuid.uuid4().hex, DELIVERIES_HEADER: 0}
        self._call(f"publish to queue {queue!r}", lambda: self._place(queue, body, headers,
                                                                       delay))

    def _place(self, queue: str, body: bytes, headers: dict[str, Any], delay: float) -> None:
        """Send to the queue, or to its delay level stamped with the due time."""
        if delay <= 0:
            self._send(self._name(queue), body, headers)
            return
        due = time.time() + delay
        level = level_of(delay)
        self._send(self._level_name(queue, level), body, {**headers, DUE_HEADER: repr(due)})
        key = (queue, level)
        if key in self._next_look:  # we consume it: look again when it must move
            self._next_look[key] = min(self._next_look[key],
                                       time.monotonic() + delay - level_floor(level))

    # -- consuming -----------------------------------------------------------------------

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
        if self._sub is not None or self._want is None:
            return self._sub
        if self._backoff.pause() > 0:
            return None
        try:
            self._connection()
            self._sub = Subscription(self, *self._want)
            self._backoff.reset()
        except self._errors as exc:
            self._consumer_failed("subscribing", exc)
        return self._sub

    def _consumer_failed(self, what: str, exc: BaseException) -> None:
        self._drop()
        pause = self._backoff.failed()
        log.warning("%s: the kombu broker %s is unreachable (%s); deliveries held from the "
                    "lost connection will be redelivered; attempt %d failed, next in %.1f s",
                    what, self.settings.where, one_line(exc), self._backoff.attempts, pause)

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
            self._interrupted.wait(min(timeout, self._backoff.pause()))
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

    # -- settling ------------------------------------------------------------------------

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

    def _release(self, receipt: Receipt) -> None:
        if not receipt.done:
            receipt.done = True
            self._live.discard(receipt)
            self._settled()

    def ack(self, delivery: Delivery) -> None:
        self._finish(delivery, "ack")

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        """Publish a copy carrying the delivery count (through a delay level), then ack."""
        headers = {ID_HEADER: uuid.uuid4().hex, DELIVERIES_HEADER: delivery.delivery_count}
        new_body = delivery.body if body is None else body
        self._finish(delivery, "retry_later",
                     lambda: self._place(delivery.queue, new_body, headers, delay))

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Publish to `<queue>.dead` with reason, time and count in headers, then ack."""
        old = delivery.receipt.message.headers if isinstance(delivery.receipt, Receipt) else {}
        headers = {ID_HEADER: (old or {}).get(ID_HEADER) or uuid.uuid4().hex,
                   REASON_HEADER: reason, DEAD_AT_HEADER: repr(time.time()),
                   DELIVERIES_HEADER: delivery.delivery_count}
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

    # -- depth ---------------------------------------------------------------------------

    def depth(self, queue: str) -> Depth:
        """Counts from `queue_declare`; in flight: what this object holds (module docstring).

        When this object consumes `queue`, messages already on their way to it (pushed by
        AMQP, or popped by a BRPOP whose reply is unread) are in neither count: it first
        waits up to `SETTLE` seconds for them to land, so a draining `--burst` worker does
        not take the in-transit message for an empty queue.
        """
        sub = self._sub
        if sub is not None and queue in sub.buffers:
            try:
                sub.drain(SETTLE)
            except self._errors as exc:
                self._consumer_failed(f"measuring the depth of {queue!r}", exc)

        def count() -> Depth:
            ready = self._declare(self._name(queue))
            dead = self._declare(self._name(queue, ".dead"))
            delayed = sum(self._declare(self._level_name(queue, k))
                          for k in range(TOP_LEVEL + 1))
            sub = self._sub
            buffered = len(sub.buffers.get(queue, ())) if sub else 0
            held = sum(1 for r in self._live if r.queue == queue)
            return Depth(ready, buffered + held, delayed, dead)
        return self._call(f"measuring the depth of queue {queue!r}", count)

    # -- wake-ups ------------------------------------------------------------------------

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

    # -- close ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections: unsettled deliveries go back to their queues."""
        if self._closed:
            return
        self._closed = True
        self._want = None
        self._drop()  # the channels' close returns what they hold, buffered ones too
        with self._lock:
            if self._waker is not None:
                self._waker.release()
                self._waker = None

    # -- admin ---------------------------------------------------------------------------

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """Browse `<queue>.dead`: take up to `limit`, then give them all back."""
        def browse() -> list[DeadLetter]:
            taken = self._take_all(self._name(queue, ".dead"), limit)
            for message in taken:
                message.requeue()
            return [dead_letter_of(queue, m) for m in taken]
        return self._call(f"listing dead letters of queue {queue!r}", browse)

    def _take_all(self, name: str, limit: int) -> list[KombuMessage]:
        if name not in self._declared:
            self._declare(name)
        taken: list[KombuMessage] = []
        source = Queue(name, channel=self._channel, no_declare=True)
        while len(taken) < limit:
            message = source.get(no_ack=False)
            if message is None:
                break
            taken.append(message)
        return taken

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Move dead letters back to `queue` as new messages with a fresh delivery count."""
        wanted = None if ids is None else set(ids)

        def move() -> int:
            moved = 0
            taken = self._take_all(self._name(queue, ".dead"), 2 ** 31)
            for message in taken:
                dead_id = dead_letter_of(queue, message).id
                if wanted is None or dead_id in wanted:
                    self._send(self._name(queue), message.body,
                               {ID_HEADER: dead_id, DELIVERIES_HEADER: 0})
                    message.ack()
                    moved += 1
                else:
                    message.requeue()
            return moved
        return self._call(f"re-queueing dead letters of queue {queue!r}", move)

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters of `queue`: all, or those in `ids` (the others go back)."""
        wanted = None if ids is None else set(ids)

        def delete() -> int:
            deleted = 0
            for message in self._take_all(self._name(queue, ".dead"), 2 ** 31):
                if wanted is None or dead_letter_of(queue, message).id in wanted:
                    message.ack()
                    deleted += 1
                else:
                    message.requeue()
            return deleted
        return self._call(f"deleting dead letters of queue {queue!r}", delete)

    def purge(self, queue: str) -> int:
        """Delete ready, delayed and dead messages of `queue` (held ones stay)."""
        names = [self._name(queue), self._name(queue, ".dead"),
                 *(self._level_name(queue, k) for k in range(TOP_LEVEL + 1))]

        def purge_all() -> int:
            total = 0
            for name in names:
                if name not in self._declared:
                    self._declare(name)
                total += int(self._channel.queue_purge(name) or 0)
            return total
        return self._call(f"purging queue {queue!r}", purge_all)


def dead_letter_of(queue: str, message: KombuMessage) -> DeadLetter:
    headers = message.headers or {}
    reason = headers.get(REASON_HEADER) or "unknown"
    return DeadLetter(id=str(headers.get(ID_HEADER) or message.delivery_tag), queue=queue,
                      body=message.body, reason=str(reason),
                      dead_at=_header_float(headers, DEAD_AT_HEADER),
                      delivery_count=max(1, _header_int(headers, DELIVERIES_HEADER)))


# -- one consuming session -----------------------------------------------------------------


class Subscription:
    """One consume loop's consumers: one per queue (first listed first).

    They live on the connection's consuming channel (`Channels`), so a later loop re-uses
    it and a dropped loop's held deliveries stay settleable. Deliveries land in a buffer per
    queue; `take` hands them out in the listed order and, before handing out one from a
    later queue, asks each earlier queue for a ready message with `basic_get` (kombu may
    deliver from several queues in any order).
    """

    def __init__(self, broker: KombuBroker, queues: tuple[str, ...], prefetch: int) -> None:
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
            self.broker._declare(name)

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
                        receipt=receipt)

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
    def open(cls, broker: KombuBroker, conn: kombu.Connection) -> Channels:
        wake_queue = broker._name(f"conveyor.wake.{uuid.uuid4().hex}")
        wake = conn.channel()
        wake.queue_declare(queue=wake_queue, durable=False, auto_delete=True, exclusive=True)
        Consumer(wake, [Queue(wake_queue, no_declare=True)], no_ack=True,
                 on_message=lambda message: None).consume()
        return cls(conn.channel(), wake_queue)
