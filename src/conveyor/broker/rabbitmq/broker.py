"""`RabbitMQBroker`: connection, declarations, publishing, consuming, settling, depth, admin.

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

**First listed queue first.** One consumer per queue on one channel, each with `basic.qos`
prefetch equal to the consumer's `prefetch`; deliveries land in a buffer per queue and
`_claim` takes from the buffers in the listed order. Before it hands out a delivery from a
later-listed queue it drains the socket, then checks each earlier-listed queue with a passive
declare and takes a ready message from it with `basic.get`. So a single-queue consumer pays
nothing, and a multi-queue one pays one round trip per earlier queue only when it serves a
later one. A later-listed queue's buffer may hold up to `prefetch` messages while earlier
queues keep the worker busy (RabbitMQ has no channel-wide prefetch on quorum queues).

**Batch claims.** `claim_more` (a worker parking a full key's backlog) streams a batch
through a second consumer on the consuming channel whose prefetch is the batch size, at most
the queue's ready count, and cancels it once that credit is used: a few round trips a batch
instead of a `basic.get` per message, and nothing rejected back (a quorum queue counts a
requeue toward `x-delivery-limit`). Its deliveries are held and settled like any other.

**Draining.** After `pause()` the consumer cancels its consumers at its next broker call
(a wait, an ack, a heartbeat) and hands back what it had buffered (nack, requeue; RabbitMQ
counts that as a delivery), so other workers start those messages during the drain.

**Consumer timeout.** RabbitMQ closes the channel of a delivery unacknowledged for longer than
the consumer timeout, and the message is redelivered. The per-queue `x-consumer-timeout`
argument (set here from `?consumer_timeout=`, seconds, default 3600) is honoured from RabbitMQ
3.12; 3.10 and 3.11 accept and ignore it and apply the broker-wide `consumer_timeout` of
rabbitmq.conf (30 minutes by default), so a WARNING names that limit when consuming from an
older server. On 3.12+ change the value with a `consumer-timeout` policy: a different argument
on an existing queue fails its declaration.

**Connection loss.** Publishing and admin calls reconnect with backoff (`broker/reconnect.py`)
for up to `?retry_seconds=` (default 60) and then raise `BrokerConnectionError`; a consumer
reconnects and re-subscribes from its consume loop, with backoff that carries across steps,
for as long as it keeps consuming. Every failed attempt is one WARNING line on logger
`conveyor.broker.rabbitmq`; pika's own logger is quieted to CRITICAL (it would log each
failure as several ERROR lines with a traceback) unless the application set its level.
pika reports any close during the handshake as a probable login error: only RabbitMQ's own
refusal (connection.close 403/530) at the first connect stops with a login message; a
connection cut mid-handshake (a node stopping or starting) is an outage, retried.
Deliveries held from a lost connection or channel can no longer be settled:
`ack`/`retry_later`/`dead_letter`/`extend_lease` raise `LeaseLost`, and RabbitMQ redelivers
them. `close()` closes the connection, which returns every
unacknowledged delivery (redelivered with `x-delivery-count`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.spec import Basic, BasicProperties

from conveyor.broker.base import (
    DEFAULT_LEASE_SECONDS,
    WATCH_POLL_SECONDS,
    Broker,
    DeadLetter,
    Delivery,
    Depth,
    Publication,
)
from conveyor.broker.rabbitmq.confirms import BatchConfirms
from conveyor.broker.rabbitmq.headers import (
    DEAD_AT_HEADER,
    DELIVERIES_HEADER,
    REASON_HEADER,
    clip_reason,
    dead_id,
    dead_letter_of,
    delivery_count,
    parse_version,
    properties,
)
from conveyor.broker.rabbitmq.ladder import (
    dead_arguments,
    dead_queue,
    delay_key,
    delay_units,
    destination_token,
    level_arguments,
    level_exchange,
    level_pattern,
    level_queue,
    queue_arguments,
    set_levels,
    validate_queue_name,
)
from conveyor.broker.rabbitmq.ledger import Receipt, Subscription
from conveyor.broker.rabbitmq.management import ManagementAPI
from conveyor.broker.rabbitmq.settings import parse_url
from conveyor.broker.reconnect import Backoff, Reconnect, one_line, quiet_library_loggers
from conveyor.errors import BrokerError, LeaseLost

LOG = logging.getLogger("conveyor.broker.rabbitmq")
quiet_library_loggers("pika")
T = TypeVar("T")

#: The first RabbitMQ release that honours the per-queue x-consumer-timeout argument.
PER_QUEUE_TIMEOUT_SINCE = (3, 12)
#: How long a management listing (delay levels, others' in-flight) is reused.
LISTING_TTL = 1.0
#: How long a consumer with owed acks and free prefetch waits for more deliveries before it
#: sends the acks and blocks (acks are Raft commands on quorum queues: batches are cheaper).
ACK_DELAY = 0.005
#: The longest single block in pika's I/O loop: a wakeup() from a signal handler on the
#: consuming thread only sets a flag (pika's thread-safe wake-up takes locks the interrupted
#: thread may hold), so it is seen within this.
WAIT_SLICE = 0.5
#: How long a consumer this object settled (a basic.get, a cancelled consumer) may still be
#: counted by RabbitMQ, which applies an ack asynchronously.
VANISH_SECONDS = 1.0
#: A batch claim (`claim_more`) of this many or fewer uses basic.get, one round trip each;
#: more use a consumer of their own (`_stream`: about five round trips, whatever the size).
GET_AT_MOST = 4
#: How long a batch consumer waits for deliveries that other consumers may have taken, and
#: how long it reads between checks of the queue's ready count.
BATCH_WAIT = 0.2
BATCH_SLICE = 0.01
#: How long nothing must arrive before an empty queue ends a batch early (deliveries already
#: assigned to the batch consumer are no longer ready, though still on their way).
BATCH_STALL = 0.05
#: How long depth waits for a new queue's first statistics from the management plugin.
STATISTICS_WAIT = 20.0
#: What to retry after reconnecting. A login refused at the first connect is not retried
#: (`_connection` turns it into BrokerError); one while reconnecting is (see refused_by_broker).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pex.AMQPConnectionError, pex.ChannelWrongStateError)
PROBABLE_LOGIN_ERRORS: tuple[type[BaseException], ...] = (
    pex.ProbableAuthenticationError, pex.ProbableAccessDeniedError)



def refused_by_broker(exc: BaseException) -> bool:
    """Whether a failed handshake is RabbitMQ saying no (bad login, no such vhost, no access),
    not a connection cut mid-handshake.

    pika reports any close during the handshake as a "probable" authentication or access
    error; only when RabbitMQ itself closed the connection (connection.close, 403 or 530)
    was it a refusal. A node that is stopping or starting just drops the socket.
    """
    if isinstance(exc, pex.AuthenticationError):  # no login mechanism in common
        return True
    if isinstance(exc, PROBABLE_LOGIN_ERRORS):
        return "ConnectionClosedByBroker" in str(exc)
    return isinstance(exc, pex.ConnectionClosedByBroker) and exc.reply_code in (403, 530)


def _noop() -> None:
    """A callback whose only job is to make `process_data_events` return."""


# -- the transport --------------------------------------------------------------------------


class RabbitMQBroker(Broker):
    """Quorum queues on RabbitMQ; see the module docstring for the design."""

    supports_priority = False
    #: Guarantees of the seam this transport keeps differently (the suite skips them, saying why).
    unsupported = {"dropped_loop_give_back": (
        "deliveries RabbitMQ pushed to a consumer go back when it is paused, cancelled or its "
        "connection closes, not when a consume loop is merely dropped")}
    weaker_guarantees = (
        "RabbitMQ: no priorities on quorum queues; a delivery held longer than the broker's "
        "consumer timeout is redelivered; other consumers' in-flight counts lag by ~5-10 s")

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self.settings = parse_url(url)
        self.connection_name = (f"conveyor {socket.gethostname()} pid {os.getpid()} "
                                f"{uuid.uuid4().hex[:8]}")
        self.settings.params.client_properties = {"connection_name": self.connection_name}
        self.server_version: tuple[int, ...] = ()
        self._mgmt = ManagementAPI(self.settings.management, self.settings.management_user,
                                   self.settings.management_password,
                                   self.settings.params.virtual_host)
        self._conn: BlockingConnection | None = None
        self._channels: dict[str, BlockingChannel] = {}
        self._batch: BatchConfirms | None = None
        self._declared: set[str] = set()
        self._levels: dict[str, set[int]] = {}  # levels this object declared, per queue
        self._listings: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}
        self._sub: Subscription | None = None
        self._want: tuple[list[str], int] | None = None  # what to re-subscribe to
        self._epoch = 0
        self._backoff = Backoff()  # the consumer's, carried across its steps
        self._reconnect = Reconnect(f"RabbitMQ at {self.settings.where}", LOG,
                                    lambda exc: isinstance(exc, CONNECTION_ERRORS),
                                    self.settings.retry_seconds)
        self._connected_once = False
        self._warned_timeout = False
        self._owner = 0  # the consuming thread
        self._vanishing_until = 0.0  # a settled basic.get or cancelled consumer still counts
        self._call("connecting", self._connection)

    # -- connection and channels -------------------------------------------------------------

    def _connection(self) -> BlockingConnection:
        """The open connection, opening one if needed (a failure raises CONNECTION_ERRORS)."""
        if self._conn is not None and self._conn.is_open:
            return self._conn
        self._drop_connection()
        try:
            conn = pika.BlockingConnection(self.settings.params)
        except CONNECTION_ERRORS as exc:
            if not self._connected_once and refused_by_broker(exc):
                raise BrokerError(f"RabbitMQ at {self.settings.where} refused the login "
                                  f"({one_line(exc)}): check the user, password and vhost in "
                                  "the broker URL") from exc
            raise
        self._conn = conn
        self._connected_once = True
        server = getattr(getattr(conn, "_impl", None), "server_properties", None) or {}
        self.server_version = parse_version(server.get("version"))
        return conn

    def _channel(self, kind: str) -> BlockingChannel:
        """A long-lived channel per purpose: `publish` (confirms) or `admin` (declares)."""
        channel = self._channels.get(kind)
        if channel is None or not channel.is_open:
            channel = self._connection().channel()
            if kind == "publish":
                channel.confirm_delivery()
            self._channels[kind] = channel
        return channel

    def _drop_connection(self) -> None:
        """Forget the connection (closing it if it is still open); the subscription is lost."""
        conn, self._conn = self._conn, None
        self._channels.clear()
        self._batch = None
        if self._sub is not None:
            self._sub.lost = True
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except (pex.AMQPError, OSError) as exc:
                LOG.debug("closing a broken RabbitMQ connection: %r", exc)

    def _lose_connection(self, what: str, exc: BaseException) -> None:
        LOG.warning("%s: the connection to RabbitMQ at %s was lost (%s); reconnecting", what,
                    self.settings.where, one_line(exc))
        self._drop_connection()

    def _call(self, what: str, op: Callable[[], T]) -> T:
        """Run `op`; if the connection is lost, reconnect with backoff and run it again, for
        up to `retry_seconds` (then BrokerConnectionError)."""
        return self._reconnect.call(what, lambda: self._attempt(op))

    def _attempt(self, op: Callable[[], T]) -> T:
        try:
            self._connection()
            return op()
        except CONNECTION_ERRORS:
            self._drop_connection()
            raise

    # -- declarations --------------------------------------------------------------------------

    def _declare_queue(self, name: str, arguments: dict[str, Any]) -> None:
        try:
            self._channel("admin").queue_declare(name, durable=True, arguments=arguments)
        except pex.ChannelClosedByBroker as exc:
            raise BrokerError(
                f"RabbitMQ refused to declare queue {name!r}: {exc.reply_text}. Conveyor "
                f"declares it durable with {arguments}; if it already exists with other "
                "arguments (a classic queue, another delivery limit), drain and delete it or "
                "change the setting back") from exc

    def _ensure_queue(self, queue: str) -> None:
        """Declare `queue` and its dead-letter queue once per broker object."""
        if queue in self._declared:
            return
        validate_queue_name(queue)
        self._declare_queue(dead_queue(queue), dead_arguments())
        self._declare_queue(queue, queue_arguments(queue, self.settings.delivery_limit,
                                                   self.settings.consumer_timeout))
        self._declared.add(queue)

    def _ensure_exchange(self, level: int) -> None:
        """Level `level`'s topic exchange, bound to the one below for a 0 bit."""
        key = f"exchange {level}"
        if key in self._declared:
            return
        admin = self._channel("admin")
        admin.exchange_declare(level_exchange(level), exchange_type="topic", durable=True)
        if level:
            self._ensure_exchange(level - 1)
            admin.exchange_bind(destination=level_exchange(level - 1),
                                source=level_exchange(level),
                                routing_key=level_pattern(level, "0", "*"))
        self._declared.add(key)

    def _ensure_level(self, queue: str, level: int) -> None:
        key = f"level {level} {queue}"
        if key in self._declared:
            return
        name = level_queue(queue, level)
        self._declare_queue(name, level_arguments(queue, level))
        self._channel("admin").queue_bind(name, level_exchange(level), routing_key=level_pattern(
            level, "1", destination_token(queue)))
        self._levels.setdefault(queue, set()).add(level)
        self._declared.add(key)

    def _ensure_ladder(self, queue: str, units: int) -> tuple[str, str]:
        """Declare what a delay of `units` walks through; return (exchange, routing key)."""
        self._ensure_queue(queue)
        top = units.bit_length() - 1
        self._ensure_exchange(top)
        arrival = f"arrival {queue}"
        if arrival not in self._declared:
            self._channel("admin").queue_bind(queue, level_exchange(0), routing_key=level_pattern(
                0, "0", destination_token(queue)))
            self._declared.add(arrival)
        for level in set_levels(units):
            self._ensure_level(queue, level)
        return level_exchange(top), delay_key(units, queue)

    def _forget(self, queue: str) -> None:
        """Declarations of `queue` (and the shared ladder exchanges) may be stale, e.g.
        deleted by an operator: declare them again next time."""
        self._declared = {k for k in self._declared if k != queue
                          and not k.endswith(f" {queue}") and not k.startswith("exchange ")}

    # -- publishing ----------------------------------------------------------------------------

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        """Publish persistently and wait for the confirm. `priority` is ignored (quorum).

        A publish whose connection is lost is retried on a new one: if RabbitMQ had stored it
        before the confirm was lost, it is stored twice (at-least-once, like redelivery).
        """
        units = delay_units(delay)
        props = properties(None, None)
        self._call(f"publishing to queue {queue!r}",
                   lambda: self._publish(queue, body, props, units))

    def publish_many(self, publications: Sequence[Publication]) -> None:
        """Publish them all, then wait once for their confirms (see `confirms.py`)."""
        if publications:
            queues = sorted({p.queue for p in publications})
            self._call(f"publishing {len(publications)} messages to {queues}",
                       lambda: self._publish_batch(publications))

    def _publish_batch(self, publications: Sequence[Publication]) -> None:
        props = properties(None, None)
        units = [delay_units(p.delay) for p in publications]
        routes = [self._route(p.queue, u, False) for p, u in zip(publications, units,
                                                                  strict=True)]
        returned = self._confirms().send(
            [(exchange, key, p.body) for (exchange, key), p in zip(routes, publications,
                                                                   strict=True)], props)
        for exchange, key, body in returned:  # a queue deleted under us: declare, send again
            i = next(i for i, (r, p) in enumerate(zip(routes, publications, strict=True))
                     if r == (exchange, key) and p.body == body)
            self._forget(publications[i].queue)
            self._publish(publications[i].queue, body, props, units[i])

    def _confirms(self) -> BatchConfirms:
        """The batch-confirming channel, opened (again) on the current connection."""
        if self._batch is None or not self._batch.is_open:
            self._batch = BatchConfirms(self._connection().channel())
        return self._batch

    def _publish(self, queue: str, body: bytes, props: BasicProperties, units: int,
                 dead: bool = False) -> None:
        """One confirmed, mandatory publish; re-declares once if the queue vanished."""
        for attempt in (1, 2):
            exchange, key = self._route(queue, units, dead)
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

    def _route(self, queue: str, units: int, dead: bool) -> tuple[str, str]:
        """(exchange, routing key) for `queue`, its delay ladder or its dead letters."""
        if units:
            return self._ensure_ladder(queue, units)
        self._ensure_queue(queue)
        return "", dead_queue(queue) if dead else queue

    def _republish(self, delivery: Delivery, body: bytes, delay: float,
                   headers: dict[str, Any], dead: bool = False) -> None:
        """Publish a copy of a held delivery; a lost connection means LeaseLost, no copy."""
        props = properties(delivery.receipt.message_id, headers)
        units = delay_units(delay)
        try:
            self._attempt(lambda: self._publish(delivery.queue, body, props, units, dead))
        except CONNECTION_ERRORS as exc:
            self._lose_connection(f"re-publishing a delivery of queue {delivery.queue!r}", exc)
            raise LeaseLost(f"the connection to RabbitMQ was lost before the message of queue "
                            f"{delivery.queue!r} could be re-published: RabbitMQ will redeliver "
                            "the original") from exc

    # -- consuming -----------------------------------------------------------------------------

    def _start_consuming(self, queues: Sequence[str], prefetch: int) -> None:
        wanted = list(queues)
        prefetch += self._ahead  # the qos window: held plus read ahead (see Broker.consume)
        self._owner = threading.get_ident()
        self._warn_consumer_timeout()
        sub = self._sub
        if sub is not None and not sub.lost and (sub.queues, sub.prefetch) == (wanted, prefetch):
            return
        self._want = (wanted, prefetch)
        try:
            self._attempt(lambda: self._subscribe(wanted, prefetch))
        except CONNECTION_ERRORS as exc:
            self._lose_connection(f"subscribing to {wanted}", exc)  # _wait will retry

    def _warn_consumer_timeout(self) -> None:
        if self._warned_timeout or not self.server_version:
            return
        self._warned_timeout = True
        if self.server_version < PER_QUEUE_TIMEOUT_SINCE:
            LOG.warning(
                "RabbitMQ %s ignores the per-queue consumer timeout (x-consumer-timeout=%.0f s "
                "is honoured from 3.12): the broker-wide consumer_timeout of rabbitmq.conf "
                "applies (30 minutes unless set): a delivery held longer is taken back and "
                "redelivered. Raise consumer_timeout above your longest task time limit.",
                ".".join(map(str, self.server_version)), self.settings.consumer_timeout)

    def _subscribe(self, queues: list[str], prefetch: int) -> None:
        """Consume `queues` in listed order with `prefetch` each, re-using a live channel."""
        for queue in queues:
            self._ensure_queue(queue)
        sub = self._sub
        if sub is None or sub.lost or not sub.channel.is_open:
            sub = self._new_subscription()
        else:
            self._unsubscribe(sub)
        sub.channel.basic_qos(prefetch_count=prefetch)
        sub.queues, sub.prefetch, sub.cancelled = list(queues), prefetch, False
        sub.ahead = self._ahead
        for queue in queues:
            sub.buffers.setdefault(queue, deque())
            sub.tags[queue] = sub.channel.basic_consume(queue, self._receiver(sub, queue))

    def _new_subscription(self) -> Subscription:
        self._epoch += 1
        channel = self._connection().channel()
        sub = Subscription(channel=channel, epoch=self._epoch)
        channel.add_on_cancel_callback(lambda frame: setattr(sub, "cancelled", True))
        self._sub = sub
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        """Cancel the consumers; buffered deliveries nobody took go back (nack, requeue)."""
        self._flush(sub)
        for tag in sub.tags.values():
            sub.channel.basic_cancel(tag)
        sub.tags.clear()
        for buffer in sub.buffers.values():
            while buffer:
                tag = buffer.popleft().receipt.tag
                sub.channel.basic_nack(tag, requeue=True)
                sub.ledger.drop(tag)
        sub.buffers.clear()

    def _receiver(self, sub: Subscription,
                  queue: str) -> Callable[[BlockingChannel, Basic.Deliver, BasicProperties,
                                           bytes], None]:
        def receive(channel: BlockingChannel, method: Basic.Deliver, props: BasicProperties,
                    body: bytes) -> None:
            delivery = self._delivery(sub, queue, method.consumer_tag, method, props, body,
                                      pushed=True)
            sub.buffers.setdefault(queue, deque()).append(delivery)
        return receive

    def _delivery(self, sub: Subscription, queue: str, consumer: str,
                  method: Basic.Deliver | Basic.GetOk, props: BasicProperties, body: bytes,
                  pushed: bool) -> Delivery:
        tag = method.delivery_tag
        sub.ledger.add(tag, queue, consumer, pushed)
        receipt = Receipt(epoch=sub.epoch, tag=tag, consumer=consumer,
                          message_id=props.message_id)
        return Delivery(queue=queue, body=body, delivery_count=delivery_count(
            props.headers or {}), receipt=receipt)

    def _live(self) -> Subscription | None:
        """The subscription if it can still deliver; notices a channel RabbitMQ closed."""
        sub = self._sub
        if sub is None or sub.lost:
            return None
        if self._conn is None or not self._conn.is_open or not sub.channel.is_open:
            reason = getattr(sub.channel, "_closing_reason", None)
            LOG.warning("consuming from %s failed: RabbitMQ closed the consuming channel or "
                        "connection (%r; a delivery held past the consumer timeout does "
                        "this); its deliveries will be redelivered; re-subscribing",
                        sub.queues, reason)
            sub.lost = True
            return None
        if sub.cancelled:
            LOG.warning("RabbitMQ cancelled the consumer of %s (queue deleted?); "
                        "re-subscribing", sub.queues)
            self._subscribe(sub.queues, sub.prefetch)
        return sub

    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Hand out one buffered delivery, first listed queue first; a consumer reading
        ahead first sends the acks its settles owe (see `_finish`)."""
        try:
            sub = self._live()
            if sub is None:
                return []
            if sub.ahead:
                self._flush(sub)
            delivery = self._take(sub, queues)
            if delivery is None:
                self._pump()
                delivery = self._take(sub, queues)
        except CONNECTION_ERRORS as exc:
            self._lose_connection("claiming a delivery", exc)
            return []
        return [] if delivery is None else [delivery]

    def claim_more(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Take up to `limit` ready deliveries now, first listed queue first, in a few round
        trips (see `_stream`); a few are taken with one basic.get each, which is cheaper."""
        got: list[Delivery] = []
        try:
            sub = self._live()
            if sub is None or self._paused:
                return []
            for queue in queues:
                if len(got) >= limit:
                    break
                counts = self._passive(queue)
                ready = min(limit - len(got), counts[0] if counts is not None else 0)
                if ready > GET_AT_MOST:
                    got += self._stream(sub, queue, ready)
                got += self._get(sub, queue, limit - len(got))
        except CONNECTION_ERRORS as exc:
            self._lose_connection("claiming a batch of deliveries", exc)
        self._held(len(got))  # from a lost channel they raise LeaseLost when settled
        return got

    def _get(self, sub: Subscription, queue: str, limit: int) -> list[Delivery]:
        """basic.get until `limit` or the queue is empty, one round trip each."""
        got: list[Delivery] = []
        while len(got) < limit:
            method, props, body = sub.channel.basic_get(queue)
            if method is None or props is None or body is None:
                break
            got.append(self._delivery(sub, queue, f"get {method.delivery_tag}", method, props,
                                      body, pushed=False))
        return got

    def _stream(self, sub: Subscription, queue: str, credit: int) -> list[Delivery]:
        """Up to `credit` deliveries from a consumer of their own, cancelled afterwards.

        RabbitMQ pushes a consumer at most its prefetch, set (basic.qos) just before it
        subscribes, and a later qos does not change an existing consumer's: so a second
        consumer on this channel with prefetch `credit`, `credit` no more than the queue's
        ready count, streams the batch in one round trip instead of `credit`. It is
        cancelled once it has used up its credit, when nothing more can be on its way:
        pika rejects a delivery that arrives after the cancel (requeue, and a quorum queue
        counts that toward x-delivery-limit: measured on 3.10). Only if other consumers
        took part of the ready messages first does it stop early, after BATCH_WAIT or once
        nothing arrived for BATCH_STALL and the queue is empty; a publish landing in that
        round trip is then rejected so, like the deliveries a paused consumer hands back.
        What it got stays unacked to this channel and is settled like a basic.get's
        (RabbitMQ counts the cancelled consumer until they are acked, and so does the
        ledger). The channel's qos is left at `credit`: `_subscribe` sets it again before
        it consumes."""
        got: list[Delivery] = []

        def receive(channel: BlockingChannel, method: Basic.Deliver, props: BasicProperties,
                    body: bytes) -> None:
            got.append(self._delivery(sub, queue, method.consumer_tag, method, props, body,
                                      pushed=True))

        sub.channel.basic_qos(prefetch_count=credit)
        tag = sub.channel.basic_consume(queue, receive)
        try:
            deadline = time.monotonic() + BATCH_WAIT
            last = (0, time.monotonic())  # deliveries so far, and when the count last grew
            while len(got) < credit and time.monotonic() < deadline:
                self._io(BATCH_SLICE)
                now = time.monotonic()
                if len(got) > last[0]:
                    last = (len(got), now)
                elif now - last[1] >= BATCH_STALL and self._taken_by_others(queue, got):
                    break
        finally:
            if sub.channel.is_open:
                sub.channel.basic_cancel(tag)
        return got

    def _taken_by_others(self, queue: str, got: list[Delivery]) -> bool:
        """Whether the queue has nothing ready and nothing more reached `got` meanwhile (a
        delivery read during the passive declare waits in pika; one more read hands it
        over, where a cancel would reject it): then nothing more is coming."""
        before = len(got)
        ready = (self._passive(queue) or (0, 0))[0]
        self._pump()
        return ready == 0 and len(got) == before

    def _pump(self) -> None:
        """Read whatever RabbitMQ has sent, without waiting."""
        self._io(0)

    def _io(self, seconds: float) -> None:
        """Run pika's I/O loop on the current connection (never a new one: a connection that
        was lost must be noticed, and re-subscribed, not silently replaced)."""
        if self._conn is None:
            raise pex.ConnectionWrongStateError("the connection to RabbitMQ was lost")
        self._conn.process_data_events(time_limit=seconds)

    def _take(self, sub: Subscription, queues: Sequence[str]) -> Delivery | None:
        for index, queue in enumerate(queues):
            buffer = sub.buffers.get(queue)
            if buffer:
                earlier = self._take_earlier(sub, queues[:index]) if index else None
                return earlier or buffer.popleft()
        return None

    def _take_earlier(self, sub: Subscription, earlier: Sequence[str]) -> Delivery | None:
        """Before serving a later-listed queue, take work an earlier-listed one has."""
        self._pump()
        for queue in earlier:
            if sub.buffers.get(queue):
                return sub.buffers[queue].popleft()
        for queue in earlier:
            counts = self._passive(queue)
            if counts is None or counts[0] == 0:
                continue
            method, props, body = sub.channel.basic_get(queue)
            if method is not None and props is not None and body is not None:
                return self._delivery(sub, queue, f"get {method.delivery_tag}", method, props,
                                      body, pushed=False)
            # Counted but not got: RabbitMQ pushed it to our consumer meanwhile; it arrives
            # before the get's empty answer on this channel, so one more read finds it.
            self._pump()
            if sub.buffers.get(queue):
                return sub.buffers[queue].popleft()
        return None

    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """Block in pika's I/O loop until a delivery, a wake-up or `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            sub = self._live()
            if sub is None:
                if not self._paused:
                    self._recover(timeout)
                else:
                    self._interrupted.wait(timeout)
                return
            self._stop_if_paused(sub)
            if sub.ledger.owed and not self._settle_owed(sub, timeout):
                return
            if self._interrupted.is_set():  # a wakeup() the ack delay's I/O took: go back
                return
            self._io(max(0.0, min(deadline - time.monotonic(), WAIT_SLICE)))
        except CONNECTION_ERRORS as exc:
            self._lose_connection(f"waiting for deliveries from {list(queues)}", exc)

    def _settle_owed(self, sub: Subscription, timeout: float) -> bool:
        """Send owed acks before blocking; True if the caller should go on and block.

        Every ack is a Raft command on a quorum queue, so acks of a whole window are sent
        as one. If the window is full RabbitMQ sends nothing until they arrive: send them
        now. Otherwise deliveries may be on their way: give them ACK_DELAY to arrive (and
        return, so they are handed out) before paying for the ack.
        """
        if sub.credit_left:
            self._io(min(timeout, ACK_DELAY))
            if any(sub.buffers.values()):
                return False
        self._flush(sub)
        return True

    def _stop_if_paused(self, sub: Subscription) -> None:
        """A paused (draining) consumer cancels its consumers and hands back what it buffered,
        so other workers run those messages now instead of after the drain."""
        if self._paused and sub.tags:
            self._unsubscribe(sub)
            sub.queues = []  # a later consume() subscribes afresh

    def _recover(self, budget: float) -> None:
        """Reconnect and re-subscribe, within `budget` seconds or until `wakeup()`."""
        deadline = time.monotonic() + budget
        if self._want is None:  # closed, or never subscribed: nothing to restore
            self._interrupted.wait(budget)
            return
        while not self._interrupted.is_set():
            pause = self._backoff.pause()
            if pause > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._interrupted.wait(min(pause, left))
                continue
            if self._resubscribe():
                return

    def _resubscribe(self) -> bool:
        assert self._want is not None
        queues, prefetch = self._want
        try:
            self._attempt(lambda: self._subscribe(queues, prefetch))
        except CONNECTION_ERRORS as exc:
            pause = self._backoff.failed()
            LOG.warning("re-subscribing to %s: RabbitMQ at %s is unreachable (%s); attempt %d "
                        "failed, next in %.1f s", queues, self.settings.where, one_line(exc),
                        self._backoff.attempts, pause)
            return False
        self._backoff.reset()
        LOG.warning("reconnected to RabbitMQ at %s and re-subscribed to %s; deliveries held "
                    "from the lost connection raise LeaseLost and will be redelivered",
                    self.settings.where, queues)
        return True

    def _interrupt_wait(self) -> None:
        """Wake pika's I/O loop from another thread. On the consuming thread itself (a signal
        handler) the interrupt flag, checked every WAIT_SLICE, is all that is safe."""
        conn = self._conn
        if conn is None or threading.get_ident() == self._owner:
            return
        try:
            conn.add_callback_threadsafe(_noop)
        except (pex.AMQPError, OSError, RuntimeError):
            pass  # closed or closing: the consume loop sees the interrupt flag anyway

    # -- settling ------------------------------------------------------------------------------

    def _owned(self, delivery: Delivery, what: str) -> Subscription:
        """The live subscription that holds `delivery`, or LeaseLost."""
        receipt = delivery.receipt
        if not isinstance(receipt, Receipt):
            raise BrokerError(f"{what}: this delivery did not come from this RabbitMQ broker")
        if receipt.done:
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r}: it was already "
                            "settled")
        sub = self._sub
        if sub is None or sub.lost or sub.epoch != receipt.epoch or not sub.channel.is_open:
            self._release(receipt)
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r}: the connection "
                            "or channel it came on was lost, so RabbitMQ will redeliver it; "
                            "its outcome was not recorded")
        return sub

    def _release(self, receipt: Receipt) -> None:
        receipt.done = True
        self._settled()

    def _finish(self, sub: Subscription, delivery: Delivery, flush: bool) -> None:
        """Settle a held delivery: owe its ack, and send owed acks when enough are due.

        A consumer reading ahead (a worker) sends them with its next claim, which follows
        its settles at once (a settle frees a slot): the runs a worker settles in one
        wake-up go as one multiple ack, one Raft command on a quorum queue instead of one
        each. It must not wait for `_wait`: it hands out what it read ahead without
        blocking there, and with its window full RabbitMQ pushes more only when acks
        arrive. A heartbeat (`extend_lease`), `depth`, `pause` and `close` send them too."""
        self._release(delivery.receipt)
        sub.ledger.settle(delivery.receipt.tag)
        if delivery.receipt.consumer not in sub.tags.values():
            self._vanishing_until = time.monotonic() + VANISH_SECONDS
        if flush or len(sub.ledger.owed) >= sub.prefetch or self._paused:
            try:
                self._flush(sub)
            except CONNECTION_ERRORS as exc:
                self._lose_connection("acknowledging deliveries", exc)
                raise LeaseLost(f"the ack of a message of queue {delivery.queue!r} did not "
                                "reach RabbitMQ (connection lost): it will be redelivered"
                                ) from exc
            try:
                self._stop_if_paused(sub)
            except CONNECTION_ERRORS as exc:
                self._lose_connection("handing back buffered deliveries", exc)

    def _flush(self, sub: Subscription) -> None:
        if sub.ledger.owed and sub.channel.is_open:
            sub.ledger.flush(lambda tag, multiple: sub.channel.basic_ack(tag, multiple=multiple))

    def ack(self, delivery: Delivery) -> None:
        sub = self._owned(delivery, "ack")
        self._finish(sub, delivery, flush=False)

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        """Publish a copy that carries the delivery count (via the ladder), then ack."""
        sub = self._owned(delivery, "retry_later")
        self._republish(delivery, delivery.body if body is None else body, delay,
                        {DELIVERIES_HEADER: delivery.delivery_count})
        self._finish(sub, delivery, flush=True)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Publish to `<queue>.dead` with reason, time and count in headers, then ack."""
        sub = self._owned(delivery, "dead_letter")
        headers = {REASON_HEADER: clip_reason(reason), DEAD_AT_HEADER: f"{time.time():.6f}",
                   DELIVERIES_HEADER: delivery.delivery_count}
        self._republish(delivery, delivery.body, 0.0, headers, dead=True)
        self._finish(sub, delivery, flush=True)

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        """Deliveries are bound to the connection: keep it alive and check it still is."""
        sub = self._owned(delivery, "extend_lease")
        try:
            self._flush(sub)
            self._stop_if_paused(sub)
            self._pump()
        except CONNECTION_ERRORS as exc:
            self._lose_connection("extending a lease", exc)
        self._owned(delivery, "extend_lease")

    # -- depth ---------------------------------------------------------------------------------

    def depth(self, queue: str) -> Depth:
        """Live ready/delayed/dead counts; in-flight as described in the module docstring."""
        family = self._listing(queue)
        levels = {n for n in family if n != queue and n != dead_queue(queue)}
        levels |= {level_queue(queue, k) for k in self._levels.get(queue, ())}
        self._call("settling acks before measuring depth", self._sync)
        counts = self._call(f"measuring the depth of queue {queue!r}", lambda: {
            name: self._passive(name) for name in [queue, dead_queue(queue), *sorted(levels)]})
        ready, consumers = counts[queue] or (0, 0)
        buffered = self._buffered(queue)
        return Depth(ready=ready + buffered,
                     in_flight=self._in_flight(queue, consumers, family, buffered),
                     delayed=sum((counts[n] or (0, 0))[0] for n in levels),
                     dead=(counts[dead_queue(queue)] or (0, 0))[0])

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
        levels = {n for n in self._listing(queue) if n != queue and n != dead_queue(queue)}
        levels |= {level_queue(queue, k) for k in self._levels.get(queue, ())}
        names = [queue, *sorted(levels)]
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

    def _passive(self, name: str) -> tuple[int, int] | None:
        """(ready messages, consumers) of an existing queue, live; None if it does not exist."""
        try:
            frame = self._channel("admin").queue_declare(name, passive=True)
        except pex.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise BrokerError(f"RabbitMQ refused to report on queue {name!r}: "
                              f"{exc.reply_text}") from exc
        return int(frame.method.message_count), int(frame.method.consumer_count)

    def _buffered(self, queue: str) -> int:
        """Deliveries RabbitMQ pushed to this object that no one was handed yet: ready, in the
        seam's terms (nobody works on them; a crash returns them), though unacked to it."""
        sub = self._sub
        return len(sub.buffers.get(queue, ())) if sub is not None and not sub.lost else 0

    def _in_flight(self, queue: str, consumers: int, family: dict[str, dict[str, Any]],
                   buffered: int) -> int:
        """Own held deliveries when every consumer is ours, else the management API's count
        (less what this object buffered, which `depth` reports as ready)."""
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
        counts = self._call(f"watching queue {queue!r}", lambda: self._passive(queue))
        if counts is None:
            return 0
        ready, consumers = counts
        return ready if consumers == 0 else self.depth(queue).active

    # -- close ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Send owed acks, then close the connection: unsettled deliveries are redelivered."""
        sub = self._sub
        if sub is not None and not sub.lost:
            try:
                self._flush(sub)
            except CONNECTION_ERRORS as exc:
                LOG.warning("closing: %d ack(s) could not be sent (%r); those messages will "
                            "be redelivered", len(sub.ledger.owed), exc)
        self._drop_connection()
        self._sub = None
        self._want = None

    # -- admin ---------------------------------------------------------------------------------

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """Browse `<queue>.dead` with basic.get, then nack them all back in order."""
        return self._call(f"listing dead letters of queue {queue!r}",
                          lambda: self._browse(queue, limit))

    def _browse(self, queue: str, limit: int) -> list[DeadLetter]:
        channel = self._connection().channel()
        try:
            found = self._get_many(channel, dead_queue(queue), limit)
            if found:
                channel.basic_nack(found[-1][0].delivery_tag, multiple=True, requeue=True)
            return [dead_letter_of(queue, method, props, body) for method, props, body in found]
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
            self._publish(queue, body, properties(props.message_id, None), 0)
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
        """Purge the queue, its delay levels and its dead letters (in-flight ones stay)."""
        names = set(self._listing(queue, fresh=True))
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


# -- helpers for dead letters ---------------------------------------------------------------


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
