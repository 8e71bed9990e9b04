"""The feed: Celery's queues in, Conveyor messages out, one kombu consumer thread.

For each message on a Celery queue it publishes either the converted Conveyor message (on
`celery.<queue>`, delayed on Conveyor's broker if it has an eta) or, for a message that
cannot run, a rejection record (on `celery.<queue>.rejected`, see `outcomes.py`), and only
then acks the Celery message. A kill -9 between the two therefore duplicates at worst (the
Conveyor message keeps the Celery task id as its id, so duplicates are recognisable) and
never loses a message.

Celery's queues are declared the way Celery declares them (a durable direct exchange and
queue of the same name) unless they already exist, in which case they are used as they are
(a quorum queue stays one).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import kombu
from amqp import Channel as AmqpChannel
from kombu import Exchange, Queue
from kombu.message import Message as KombuMessage
from kombu.mixins import ConsumerMixin
from kombu.transport.redis import QoS as RedisQoS
from kombu.transport.virtual.base import QoS as VirtualQoS

from conveyor.broker import Publication
from conveyor.celery_intake.conversion import (
    Accepted,
    CeleryMessage,
    Rejected,
    StartsRun,
    convert,
)
from conveyor.celery_intake.names import CANVAS_QUEUE, intake_queue, rejects_queue
from conveyor.client import Client
from conveyor.errors import ConfigError, MessageError
from conveyor.locations import redact
from conveyor.tasks import Task

log = logging.getLogger("conveyor.celery_intake")

#: How long a batch waits for one more message before it is moved (seconds).
LINGER = 0.001
#: How long the first message of a batch waits at most for the batch to fill (seconds).
MAX_WAIT = 0.005

#: Query options of --celery-broker that are kombu transport options, not URL parts.
TRANSPORT_OPTIONS = {"visibility_timeout": float, "global_keyprefix": str}


def celery_connection(url: str) -> kombu.Connection:
    """A kombu connection to Celery's broker; `?visibility_timeout=` etc. become options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, Any] = {}
    try:
        options = {k: TRANSPORT_OPTIONS[k](v) for k, v in query if k in TRANSPORT_OPTIONS}
    except ValueError as exc:
        raise ConfigError(f"--celery-broker {redact(url)!r}: {exc}") from None
    rest = [(k, v) for k, v in query if k not in TRANSPORT_OPTIONS]
    return kombu.Connection(urlunsplit(parts._replace(query=urlencode(rest))),
                            transport_options=options, connect_timeout=5)


def record(raw: CeleryMessage, reason: str, state: str) -> bytes:
    """A rejected Celery message as JSON: its reason, its headers, its body untouched."""
    return json.dumps({
        "reason": reason, "state": state, "celery_queue": raw.queue, "task": raw.task_name,
        "id": raw.task_id, "content_type": raw.content_type,
        "content_encoding": raw.content_encoding, "headers": dict(raw.headers),
        "body_base64": base64.b64encode(raw.body).decode()}, default=str).encode()


class Feed(ConsumerMixin):
    """kombu's ConsumerMixin supplies the loop, reconnects and `should_stop`."""

    def __init__(self, connection: kombu.Connection, celery_queues: tuple[str, ...],
                 client: Client, lookup: Callable[[str], Task[Any, Any] | None],
                 reply_to: str = "", prefetch: int = 64, canvas_runs: bool = False) -> None:
        """`canvas_runs`: chains and chords start scheduler runs (canvas_runs.py)."""
        self.connection = connection
        self.canvas_runs = canvas_runs
        self.celery_queues = celery_queues
        self.client = client
        self.lookup = lookup
        self.reply_to = reply_to
        self.prefetch = prefetch
        self.fed = 0
        self.held: list[tuple[str, KombuMessage]] = []
        self._first_held = 0.0

    def get_consumers(self, consumer: Callable[..., Any], channel: Any) -> list[Any]:
        existing = self._existing()
        return [consumer(queues=[_celery_queue(name, channel, name in existing)],
                         no_ack=False, prefetch_count=self.prefetch,
                         on_message=self._handler(name))
                for name in self.celery_queues]

    def _existing(self) -> set[str]:
        """Which Celery queues exist already, probed on a connection of their own (a 404
        closes the channel, and a reused channel number would then drop deliveries)."""
        found = set()
        with self.connection.clone() as probe:
            for name in self.celery_queues:
                channel = probe.channel()
                try:
                    channel.queue_declare(queue=name, passive=True)
                    found.add(name)
                except probe.channel_errors:
                    pass
                finally:
                    _close(channel)
        return found

    def _handler(self, celery_queue: str) -> Callable[[KombuMessage], None]:
        def on_message(message: KombuMessage) -> None:
            if not self.held:
                self._first_held = time.monotonic()
            self.held.append((celery_queue, message))
        return on_message

    def consume(self, limit: int | None = None, timeout: float | None = None,
                safety_interval: float = 1, **kwargs: Any) -> Iterator[None]:
        """ConsumerMixin's loop, moving what arrived in batches (see `flush`).

        A batch closes when it holds `prefetch` messages (Celery's broker sends no more until
        some are acked), when nothing more arrives within `LINGER` seconds, or when its
        oldest message has waited `MAX_WAIT`. What is held when a connection error ends the
        loop is neither published nor acked: Celery's broker delivers it again.
        """
        with self.consumer_context(**kwargs) as (conn, _channel, _consumers):
            while not self.should_stop:
                try:
                    conn.drain_events(timeout=LINGER if self.held else safety_interval)
                except TimeoutError:
                    self.flush()
                    conn.heartbeat_check()
                except OSError:
                    self.held.clear()
                    if not self.should_stop:
                        raise
                else:
                    if len(self.held) >= self.prefetch or (
                            self.held and time.monotonic() - self._first_held >= MAX_WAIT):
                        self.flush()
                yield
            self.flush()

    def flush(self) -> None:
        """Publish the held messages to Conveyor in one call, then ack them on Celery's side.

        Anything about a message itself that goes wrong (a field of the wrong type, a body
        over Conveyor's size cap) rejects that message; only broker errors propagate, and
        those stop the feed with the Celery messages unacked.
        """
        held, self.held = self.held, []
        if not held:
            return
        self.client.broker.publish_many([self._publication(q, m) for q, m in held])
        ack_all([m for _, m in held])
        self.fed += len(held)

    def take(self, celery_queue: str, message: KombuMessage) -> None:
        """Move one message (publish, then ack): a batch of one."""
        self.held.append((celery_queue, message))
        self.flush()

    def _publication(self, celery_queue: str, message: KombuMessage) -> Publication:
        return publication(_raw(celery_queue, message), self.client, self.lookup,
                           self.reply_to, self.canvas_runs)


def publication(raw: CeleryMessage, client: Client,
                lookup: Callable[[str], Task[Any, Any] | None], reply_to: str,
                canvas_runs: bool = False) -> Publication:
    """What to publish for one Celery message: the task, the canvas whose run it starts
    (`canvas_runs`), or its rejection record."""
    outcome: Accepted | Rejected | StartsRun
    try:
        outcome = convert(raw, intake_queue(raw.queue), lookup, time.time(), reply_to,
                          canvas_runs)
        if isinstance(outcome, Accepted):
            return client.publication(outcome.message, outcome.delay)
        if isinstance(outcome, StartsRun):
            return Publication(CANVAS_QUEUE, record(raw, "starts a canvas run", ""),
                               delay=outcome.delay)
    except (MessageError, ValueError, TypeError, KeyError, AttributeError) as exc:
        outcome = Rejected(f"cannot be converted ({type(exc).__name__}: {exc})")
    log.warning("Celery message %s (%s) from queue %r is rejected: %s", raw.task_id,
                raw.task_name or "?", raw.queue, outcome.reason)
    return Publication(rejects_queue(raw.queue), record(raw, outcome.reason, outcome.state))


def ack_all(messages: list[KombuMessage]) -> None:
    """Ack `messages` (in delivery order, all from one channel) in as few round trips as the
    transport allows: AMQP acks every tag up to the last with one `multiple` ack; kombu's
    Redis transport removes them from its unacked index in one pipeline."""
    channel = getattr(messages[-1], "channel", None)
    qos = getattr(channel, "qos", None)
    if isinstance(qos, RedisQoS):
        with qos.pipe_or_acquire() as pipe:
            for m in messages:
                qos._remove_from_indices(m.delivery_tag, pipe)
            pipe.execute()
        for m in messages:
            VirtualQoS.ack(qos, m.delivery_tag)
    elif isinstance(channel, AmqpChannel):
        messages[-1].ack(multiple=True)
    else:
        for m in messages:
            m.ack()


def _raw(celery_queue: str, message: KombuMessage) -> CeleryMessage:
    """The message as it came, body as bytes (py-amqp decodes text bodies itself)."""
    encoding = message.content_encoding or "utf-8"
    body = message.body or b""
    if isinstance(body, str):
        body = body.encode("utf-8" if encoding == "binary" else encoding)
    return CeleryMessage(queue=celery_queue, content_type=message.content_type or "",
                         content_encoding=encoding, headers=message.headers or {}, body=body,
                         properties=message.properties or {})


def _celery_queue(name: str, channel: Any, exists: bool) -> Queue:
    """Celery's own declaration of queue `name`, or the existing queue used as it is."""
    return Queue(name, Exchange(name, type="direct", durable=True), routing_key=name,
                 durable=True, no_declare=exists, channel=channel)


def _close(channel: Any) -> None:
    try:
        channel.close()
    except Exception as exc:  # a channel closed by the broker's 404 may fail to close again
        log.debug("closing a probe channel: %r", exc)
