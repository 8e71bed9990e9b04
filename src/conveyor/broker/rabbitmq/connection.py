"""RabbitMQ's connection, channels and declarations: what each role of `RabbitMQBroker`
stands on (`producer`, `consumer`, `inspector`, `admin`, in that order, each a subclass of
the one before).

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

**A cluster.** A URL naming several nodes (`amqp://u:p@h1,h2,h3/vhost`, see `settings`) is
walked in its order at every connect and reconnect, with a pause of up to `HOST_JITTER` s at
random before each next node (so a fleet that lost one node does not land on the next in
one step; the reconnect backoff adds its own jitter before the walk). The node a
connection was lost from is tried last: it is the one most likely down, and a dead host
that drops packets costs a connect timeout. When no node answers, the error names each one
and why (`NoNodeAnswered`); a reconnect retries the walk like any lost connection. Queues are
quorum queues: on a cluster each is replicated on up to RabbitMQ's
`quorum_cluster_size` nodes (3 by default on 3.10) running at its declaration.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from conveyor import refusals
from conveyor.broker.base import DEFAULT_LEASE_SECONDS, Broker
from conveyor.broker.rabbitmq.bands import band_queue, bands_high_first
from conveyor.broker.rabbitmq.confirms import BatchConfirms
from conveyor.broker.rabbitmq.headers import parse_version
from conveyor.broker.rabbitmq.ladder import (
    dead_arguments,
    dead_queue,
    delay_key,
    destination_token,
    level_arguments,
    level_exchange,
    level_pattern,
    level_queue,
    queue_arguments,
    set_levels,
    validate_queue_name,
)
from conveyor.broker.rabbitmq.ledger import Subscription
from conveyor.broker.rabbitmq.liveness import Liveness
from conveyor.broker.rabbitmq.management import ManagementAPI
from conveyor.broker.rabbitmq.settings import parse_url
from conveyor.broker.reconnect import Reconnect, Recovery, quiet_library_loggers
from conveyor.errors import BrokerError, Refused, one_line

LOG = logging.getLogger("conveyor.broker.rabbitmq")
quiet_library_loggers("pika")
T = TypeVar("T")

#: What to retry after reconnecting. A login refused at the first connect is not retried
#: (`_connection` turns it into BrokerError); one while reconnecting is (see refused_by_broker).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pex.AMQPConnectionError, pex.ChannelWrongStateError,
    # what BlockingConnection raises as it is, e.g. a handshake the port never answers
    AMQPConnectorException)
#: The longest pause, at random, before trying the next node of a multi-host URL.
HOST_JITTER = 0.1
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


def root_cause(exc: BaseException) -> BaseException:
    """What pika's connection errors wrap, innermost (`AMQPConnectionError` holds an
    `AMQPConnectorSocketConnectError` whose `exception` is the `ConnectionRefusedError`)."""
    for _ in range(5):
        inner = exc.args[0] if exc.args else getattr(exc, "exception", None)
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


class NoNodeAnswered(pex.AMQPConnectionError):  # type: ignore[misc]  # pika is untyped
    """No node of a multi-host URL answered: each node, and why (a lost connection, so it
    is retried like one)."""

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        self.failures = failures
        super().__init__("no RabbitMQ node answered: " + "; ".join(
            f"{where}: {one_line(root_cause(exc))}" for where, exc in failures))

    def __str__(self) -> str:
        return str(self.args[0])


class RabbitMQConnection(Broker):
    """The connection, its long-lived channels and declarations, shared by every role
    (see the module docstring)."""

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self.settings = parse_url(url)
        self.connection_name = (f"conveyor {socket.gethostname()} pid {os.getpid()} "
                                f"{uuid.uuid4().hex[:8]}")
        for params in self.settings.hosts:
            params.client_properties = {"connection_name": self.connection_name}
        #: the node of `settings.hosts` connected now, or last (-1: none yet)
        self.node = -1
        self._last_lost = -1  # the node the last connection was lost from: tried last
        self.server_version: tuple[int, ...] = ()
        self._mgmt = ManagementAPI(self.settings.management, self.settings.management_user,
                                   self.settings.management_password,
                                   self.settings.params.virtual_host)
        self._conn: BlockingConnection | None = None
        self._liveness: Liveness | None = None   # the open connection's (self-fencing)
        self._opened_at = 0.0
        self._channels: dict[str, BlockingChannel] = {}
        self._batch: BatchConfirms | None = None
        self._declared: set[str] = set()
        self._levels: dict[str, set[int]] = {}  # levels this object declared, per queue
        self._listings: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}
        self._sub: Subscription | None = None
        self._want: tuple[list[str], int] | None = None  # what to re-subscribe to
        self._epoch = 0
        self._reconnect = Reconnect(f"RabbitMQ at {self.settings.where}", LOG,
                                    lambda exc: isinstance(exc, CONNECTION_ERRORS),
                                    self.settings.retry_seconds, refusals.rabbitmq,
                                    stopping=self._stopping)
        self._recovery = Recovery(self._reconnect)  # the consumer's, across its steps
        self._connected_once = False
        self._holder: Callable[[socket.socket], None] | None = None
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
        conn = self._open()
        self._conn = conn
        self._liveness = Liveness(conn, self._opened_at)
        self._connected_once = True
        self._hand_to_holder(conn)
        server = getattr(getattr(conn, "_impl", None), "server_properties", None) or {}
        self.server_version = parse_version(server.get("version"))
        return conn

    def _open(self) -> BlockingConnection:
        """A new connection to the first node that answers (see the module docstring)."""
        hosts = self.settings.hosts
        order = [n for n in range(len(hosts)) if n != self._last_lost]
        order += [n for n in range(len(hosts)) if n == self._last_lost]
        failures: list[tuple[str, BaseException]] = []
        for n in order:
            if failures:
                time.sleep(random.uniform(0, HOST_JITTER))
            try:
                self._opened_at = time.monotonic()
                conn = pika.BlockingConnection(hosts[n])
            except CONNECTION_ERRORS as exc:
                if not self._connected_once and refused_by_broker(exc):
                    raise Refused(f"RabbitMQ at {self.settings.where} refused the login "
                                  f"({one_line(exc)}): check the user, password and vhost "
                                  "in the broker URL") from exc
                failures.append((self.settings.host_names[n], exc))
                continue
            if len(hosts) > 1 and n != self.node:
                LOG.info("connected to RabbitMQ node %s (%d of %d in the broker URL)",
                         self.settings.host_names[n], n + 1, len(hosts))
            self.node = n
            return conn
        if len(failures) == 1:
            raise failures[0][1]
        raise NoNodeAnswered(failures)

    @property
    def fence_seconds(self) -> float:
        """Two heartbeat timeouts of the connection: RabbitMQ keeps it (and its deliveries)
        at least that long after it last read from it (liveness.py); infinite without
        heartbeats."""
        return self._liveness.lease if self._liveness is not None else math.inf

    def _lease_until(self) -> float:
        """When RabbitMQ may close the connection at the earliest, as proven so far."""
        return self._liveness.lease_until() if self._liveness is not None else math.inf

    def hold_connections_with(self, hold: Callable[[socket.socket], None]) -> None:
        """Deliveries go back the moment the connection closes (see `Broker`)."""
        self._holder = hold
        if self._conn is not None and self._conn.is_open:
            self._hand_to_holder(self._conn)

    def _hand_to_holder(self, conn: BlockingConnection) -> None:
        """pika keeps the connection's socket on its transport (pika 1.x)."""
        if self._holder is None:
            return
        sock = getattr(getattr(getattr(conn, "_impl", None), "_transport", None), "_sock", None)
        if isinstance(sock, socket.socket):
            self._holder(sock)
        else:
            LOG.warning("cannot find the socket of pika's connection (pika %s): if this worker "
                        "is killed, RabbitMQ may redeliver its messages while its runners "
                        "still run", pika.__version__)

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
        self._liveness = None
        if conn is not None:
            self._last_lost = self.node
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
        """Declare `queue`, its priority bands and its dead-letter queue once per broker
        object. Every band always exists beside the queue (see `bands`): a consumer
        consumes them all, and depth, watch and purge need no listing to find them."""
        if queue in self._declared:
            return
        validate_queue_name(queue)
        expires = self.settings.pinned_queue_expires
        self._declare_queue(dead_queue(queue), dead_arguments(queue, expires))
        arguments = queue_arguments(queue, self.settings.delivery_limit,
                                    self.settings.consumer_timeout, expires)
        for name in bands_high_first(queue):
            self._declare_queue(name, arguments)  # dead letters of every band: <queue>.dead
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

    def _ensure_level(self, queue: str, level: int, destination: str) -> None:
        """Level `level` of `queue`'s ladder, routing on to `destination` (`queue` or one
        of its bands: the levels are shared by the bands, each bound with its token)."""
        name = level_queue(queue, level)
        for target, key in ((queue, f"level {level} {queue}"),
                            (destination, f"bind {level} {destination}")):
            if key in self._declared or (key.startswith("bind") and target == queue):
                continue
            if target == queue:
                self._declare_queue(name, level_arguments(
                    queue, level, self.settings.pinned_queue_expires))
                self._levels.setdefault(queue, set()).add(level)
            self._channel("admin").queue_bind(name, level_exchange(level),
                                              routing_key=level_pattern(
                                                  level, "1", destination_token(target)))
            self._declared.add(key)

    def _ensure_ladder(self, queue: str, units: int, band: int) -> tuple[str, str]:
        """Declare what a delay of `units` into `band` walks through; return (exchange,
        routing key). A band above 0 is never routed through level 0 (`even_units`)."""
        self._ensure_queue(queue)
        destination = band_queue(queue, band)
        top = units.bit_length() - 1
        self._ensure_exchange(top)
        arrival = f"arrival {destination}"
        if arrival not in self._declared:
            self._channel("admin").queue_bind(destination, level_exchange(0),
                                              routing_key=level_pattern(
                                                  0, "0", destination_token(destination)))
            self._declared.add(arrival)
        for level in set_levels(units):
            self._ensure_level(queue, level, destination)
        return level_exchange(top), delay_key(units, destination)

    def _forget(self, queue: str) -> None:
        """Declarations of `queue` and its bands (and the shared ladder exchanges) may be
        stale, e.g. deleted by an operator: declare them again next time."""
        def stale(key: str) -> bool:
            name = key.rsplit(" ", 1)[-1]
            return name == queue or name.startswith(f"{queue}.pri.") or \
                key.startswith("exchange ")
        self._declared = {k for k in self._declared if not stale(k)}

    # -- reading -------------------------------------------------------------------------------

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

    def _pump(self) -> None:
        """Read whatever RabbitMQ has sent, without waiting."""
        self._io(0)

    def _io(self, seconds: float) -> None:
        """Run pika's I/O loop on the current connection (never a new one: a connection that
        was lost must be noticed, and re-subscribed, not silently replaced)."""
        if self._conn is None:
            raise pex.ConnectionWrongStateError("the connection to RabbitMQ was lost")
        if self._liveness is not None:
            self._liveness.probe()
        self._conn.process_data_events(time_limit=seconds)
