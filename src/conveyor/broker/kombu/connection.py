"""kombu's connection, channels and declarations: what each role of `KombuBroker` stands on
(`producer`, `consumer`, `inspector`, `admin`, in that order, each a subclass of the one
before). Connection loss: calls retry through `broker/reconnect.py` (see the package
docstring).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import kombu
from kombu import Exchange, Producer
from kombu.exceptions import OperationalError

from conveyor import refusals
from conveyor.broker.bands import TOP_BAND, priority_of
from conveyor.broker.base import DEFAULT_LEASE_SECONDS, Broker
from conveyor.broker.kombu.messages import Receipt
from conveyor.broker.kombu.settings import (
    CONNECTION_BOUND,
    describe_limits,
    kombu_priority,
    parse_url,
    priority_hint,
)
from conveyor.broker.kombu.subscription import Channels, Subscription
from conveyor.broker.rabbitmq.settings import DEFAULT_PINNED_QUEUE_EXPIRES
from conveyor.broker.reconnect import Reconnect, Recovery, quiet_library_loggers
from conveyor.errors import BrokerError, ConfigError, one_line
from conveyor.kinds import is_pinned_queue

log = logging.getLogger("conveyor.broker.kombu")
quiet_library_loggers("kombu", "amqp")
T = TypeVar("T")
#: What the consumer's line per failed reconnect attempt adds (`_drop` says why).
HELD_NOTE = "deliveries held from the lost connection will be redelivered"


class KombuConnection(Broker):
    """The connection, its publishing channel and declarations, shared by every role."""

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self.settings = parse_url(url)
        transport = self.settings.transport
        self.supports_priority = kombu_priority(transport, 0) is not None
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
        self._live: set[Receipt] = set()  # deliveries handed out and not settled
        self._loop: object | None = None  # the consume loop now running
        self._closed = False
        #: the node of `settings.hosts` connected now, or last; the one lost last
        self.node = 0
        self._last_lost = ""
        self._holder: Callable[[socket.socket], None] | None = None
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
                                    self._is_loss, self.settings.retry_seconds,
                                    refusals.kombu, stopping=self._stopping)
        self._recovery = Recovery(self._reconnect, HELD_NOTE)  # the consumer's, across steps
        self._call("connecting", self._connection)

    # -- names and connections ---------------------------------------------------------

    def _name(self, queue: str, suffix: str = "") -> str:
        return f"{self.settings.prefix}{queue}{suffix}"

    def _level_name(self, queue: str, level: int) -> str:
        return self._name(queue, f".delay.{level}")

    def _connection(self) -> kombu.Connection:
        if self._conn is None:
            conn = self._open()
            self._conn, self._declared = conn, set()
            self._open_channel(conn)
            self._hand_to_holder(conn)
        return self._conn

    def _open(self) -> kombu.Connection:
        """A connection to the first node that answers: kombu walks its ';' list in the
        order given (the node the last connection was lost from last), with no pause
        within one walk; when none answers, the error names each node and why."""
        hosts = list(self.settings.hosts)
        if self._last_lost in hosts:
            hosts.remove(self._last_lost)
            hosts.append(self._last_lost)
        conn = kombu.Connection(";".join(hosts), connect_timeout=5,
                                transport_options=dict(self.settings.transport_options))
        failures: list[str] = []

        def failed(exc: BaseException, interval: float) -> None:
            failures.append(f"{conn.hostname}:{conn.port}: {one_line(exc)}")
        try:
            conn.ensure_connection(max_retries=max(1, len(hosts) - 1), errback=failed)
        except self._errors as exc:
            if len(hosts) == 1 or not self._is_loss(exc):
                raise
            failures.append(f"{conn.hostname}:{conn.port}: {one_line(exc)}")
            raise ConnectionError("no RabbitMQ node answered: "
                                  + "; ".join(failures)) from exc
        index = self._node_of(conn)
        if len(hosts) > 1 and index != self.node:
            log.info("connected to RabbitMQ node %s:%s (%d of %d in the broker URL)",
                     conn.hostname, conn.port, index + 1, len(hosts))
        self.node = index
        return conn

    def _node_of(self, conn: kombu.Connection) -> int:
        """The index in `settings.hosts` of the node `conn` is connected to."""
        for n, url in enumerate(self.settings.hosts):
            parts = urlsplit(url)
            if (parts.hostname, parts.port or conn.port) == (conn.hostname, conn.port):
                return n
        return 0

    def _open_channel(self, conn: kombu.Connection) -> None:
        """The channel for publishing, declaring and admin (consuming has its own)."""
        self._channel = conn.channel()
        self._producer = Producer(self._channel, exchange=Exchange(""))

    def hold_connections_with(self, hold: Callable[[socket.socket], None]) -> None:
        """On AMQP deliveries go back the moment the connection closes (see `Broker`); the
        virtual transports' come back after their visibility timeout, a lease."""
        if self.settings.transport in CONNECTION_BOUND:
            self._holder = hold
            if self._conn is not None:
                self._hand_to_holder(self._conn)

    def _hand_to_holder(self, conn: kombu.Connection) -> None:
        """py-amqp keeps the connection's socket on its transport."""
        if self._holder is None:
            return
        sock = getattr(getattr(conn.connection, "transport", None), "sock", None)
        if isinstance(sock, socket.socket):
            self._holder(sock)
        else:
            log.warning("cannot find the socket of kombu's %s connection: if this worker is "
                        "killed, its messages may be redelivered while its runners still run",
                        self.settings.transport)

    def _drop(self) -> None:
        """Forget the connection (it failed or is closing).

        Deliveries held from it are no longer ours (the broker redelivers them): they stop
        counting against prefetch at once, and settling one raises LeaseLost.
        """
        conn, self._conn, self._sub, self._chans = self._conn, None, None, None
        if conn is not None and len(self.settings.hosts) > 1:
            self._last_lost = self.settings.hosts[self.node]
        self._epoch += 1
        for receipt in list(self._live):
            self._release(receipt)
        if conn is not None:
            try:
                conn.release()
            except Exception as exc:  # closing a broken connection may fail in many ways
                log.debug("closing a kombu connection: %r", exc)

    def _release(self, receipt: Receipt) -> None:
        if not receipt.done:
            receipt.done = True
            self._live.discard(receipt)
            self._settled()

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
                raise BrokerError(f"{self.settings.where} refused {what}: {exc}"
                                  + priority_hint(exc)) from exc
            except self._errors:
                self._drop()
                raise
        return self._reconnect.call(what, attempt)

    def _declare(self, name: str, main: bool = False) -> int:
        """Declare a durable queue (idempotent); its ready-message count. A `main` queue
        (not a dead or delay queue) on AMQP orders its messages by band (x-max-priority)."""
        arguments = dict(self.settings.queue_arguments)
        if main and self.supports_priority and self.settings.transport in CONNECTION_BOUND:
            arguments["x-max-priority"] = TOP_BAND
        if self.settings.transport in CONNECTION_BOUND and is_pinned_queue(name):
            # a code version's queue (and its dead and delay queues) goes once unused, as on
            # Conveyor's own RabbitMQ broker (rabbitmq/ladder.expiry)
            arguments.setdefault("x-expires", int(DEFAULT_PINNED_QUEUE_EXPIRES * 1000))
        ok = self._channel.queue_declare(queue=name, durable=True, auto_delete=False,
                                         arguments=arguments or None)
        self._declared.add(name)
        return int(ok.message_count or 0)

    def _send(self, name: str, body: bytes, headers: dict[str, Any],
              main: bool = False) -> None:
        """Publish to queue `name`, in the band of the priority its headers carry."""
        if name not in self._declared:
            self._declare(name, main)
        priority = kombu_priority(self.settings.transport, priority_of(headers))
        self._producer.publish(body, exchange="", routing_key=name, headers=headers,
                               delivery_mode=2, content_type="application/octet-stream",
                               content_encoding="binary", priority=priority)
