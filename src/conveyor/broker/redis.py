"""Redis transport: sorted sets and Lua scripts on one Redis server (6.0 or newer).

Layout (written down in `lua/lib.lua`): one hash per message, and per queue four sorted
sets (ready, delayed, in flight, dead) plus a wake list. Every state change that must be
atomic (publish, claim, ack, retry, dead-letter, heartbeat, release) is one Lua script in
`lua/`, reading the *server* clock, so clients with skewed clocks agree on due times and
lease deadlines.

Leases: a claim moves messages to the in-flight set scored by their own lease deadline and
stamps each with a lease token; every settle presents the token and raises `LeaseLost` if
another consumer has claimed the message since. The claim script is also the rescuer: it
first moves due delayed messages and expired leases back to ready, so a killed consumer's
work comes back as soon as its leases run out, with nothing else running.

Blocking, not polling: publishers push a token onto the queue's wake list; an idle
consumer BLPOPs the wake lists of its queues plus a private key that `wakeup()` pushes
through a second connection. The BLPOP timeout is the nearest of: the caller's timeout,
the next due delayed message or lease deadline in its queues (reported by the claim that
just came back empty), and `WAIT_CAP`, a safety net.

Connection loss: every call retries with backoff (`broker/reconnect.py`), logging one WARNING
on `conveyor.broker.redis` each time. Consumers retry until Redis is back or `wakeup()`
interrupts them; publishers, settles and admin calls give up after `retry_seconds` (URL
option, default 60) with `BrokerConnectionError`. A call whose connection dropped after
the server ran it may run twice: a publish may then be duplicated (at-least-once), a claim
leaves its messages in flight until their lease expires, and a settle reports `LeaseLost`.

URL: ``redis://[:password@]host:port/db?prefix=conveyor&retry_seconds=60`` (``rediss://``
for TLS); other query options are redis-py's own. Every key starts with ``<prefix>:``.
Single-node Redis only: scripts derive message keys from ids, which Redis Cluster forbids.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, NoScriptError
from redis.retry import Retry

from conveyor import redis_clients, refusals
from conveyor.broker.base import (
    DEFAULT_LEASE_SECONDS,
    Broker,
    DeadLetter,
    Delivery,
    Depth,
    Publication,
)
from conveyor.broker.reconnect import (
    DEPRECATED_RETRY_OPTION,
    RETRY_OPTION,
    Reconnect,
    Recovery,
    retry_seconds,
)
from conveyor.errors import BrokerError, ConfigError, LeaseLost, NotConfirmed, Refused, one_line
from conveyor.locations import redact

log = logging.getLogger("conveyor.broker.redis")

T = TypeVar("T")

#: Errors that mean "the connection is gone or Redis is not answering": worth a reconnect.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)
#: ...except these, which redis-py files under ConnectionError: bad credentials or ACL.
REFUSED = (AuthenticationError, AuthorizationError)
#: Longest BLPOP without a wake-up: a safety net should a wake token ever be missed.
WAIT_CAP = 5.0
#: Socket read timeout; above WAIT_CAP so a BLPOP never times out on the client side.
SOCKET_TIMEOUT = WAIT_CAP + 10.0
#: Priorities are folded into one exact double per message (see lua/lib.lua).
PRIORITY_LIMIT = 8191
#: Most messages one claim takes (a Lua script returns at most ~8000 values).
CLAIM_MAX = 1000
#: Messages one admin script call touches, so a huge queue never blocks Redis for long.
ADMIN_BATCH = 1000
#: The scripts whose writes the durable mode WAITs for: a publish (raises if unconfirmed) and
#: the settles (a lost one only runs the message again: warned).
CONFIRMED = frozenset({"publish", "ack", "retry_later", "dead_letter"})
SCRIPTS = ("publish", "claim", "ack", "retry_later", "dead_letter", "extend_lease", "release",
           "depth", "dead_letters", "requeue_dead", "purge_dead", "purge", "nudge", "peek")


@cache
def script_source(name: str) -> str:
    """`lua/<name>.lua` with the shared helpers of `lua/lib.lua` in front of it."""
    lua = resources.files("conveyor.broker").joinpath("lua")
    return lua.joinpath("lib.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


def parse_url(url: str) -> tuple[str, str, float]:
    """Split off Conveyor's own options: (URL for redis-py, key prefix, retry seconds)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in ("prefix", RETRY_OPTION, DEPRECATED_RETRY_OPTION)}
    rest = [(k, v) for k, v in query if k not in ours]
    prefix = ours.get("prefix", "conveyor")
    if not prefix or any(c.isspace() for c in prefix):
        raise ConfigError(f"Redis URL {redact(url)!r}: prefix={prefix!r} must be a non-empty "
                          "word, e.g. ?prefix=conveyor")
    limit = retry_seconds(ours, url)
    return urlunsplit(parts._replace(query=urlencode(rest))), prefix, limit


class RedisBroker(Broker):
    """Queues as sorted sets on one Redis server, changed only by Lua scripts."""

    supports_priority = True
    leases = True

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self._url, self.prefix, limit = parse_url(url)
        self._durable = redis_clients.durable(url)
        self._reconnect = Reconnect(f"Redis at {redact(self._url)}", log, self._retryable,
                                    limit, refusals.redis, stopping=self._stopping)
        self._recovery = Recovery(self._reconnect)  # a consumer's, across its steps
        #: CLIENT SETNAME of this broker's connections, so operators can find them.
        self.connection_name = f"conveyor-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._wake_key = f"{self.prefix}:c:{self.connection_name}:wake"
        self._tokens = itertools.count()
        self._leases: dict[str, tuple[str, str]] = {}  # id -> (queue, token), for close()
        self._due_at: float | None = None  # monotonic time the last empty claim said to wake
        self._closed = False
        self._signal: redis.Redis | None = None  # wakeup()'s own connection, made on demand
        self._signal_lock = threading.Lock()
        self._signal_owner: int | None = None  # thread inside _interrupt_wait, if any
        self._unread: list[Delivery] = []  # acks sent whose answers are still on the wire
        self._client = self._reconnect.call("connect",
                                            lambda: self._connect(self.connection_name))
        self._scripts = {name: self._client.register_script(script_source(name))
                         for name in SCRIPTS}

    # -- keys and connections ------------------------------------------------------------

    def _key(self, queue: str, kind: str) -> str:
        return f"{self.prefix}:q:{queue}:{kind}"

    def _message_key(self, message_id: str) -> str:
        return f"{self.prefix}:m:{message_id}"

    def _connect(self, name: str) -> redis.Redis:
        """One dedicated connection; redis-py's own retries are off so ours can log."""
        return redis_clients.connect(
            self._url, client_name=name, single_connection_client=True,
            retry=Retry(NoBackoff(), 0), socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=5.0, socket_keepalive=True)

    # -- retries -------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn` now, or after reconnecting with backoff for up to `retry_seconds`."""
        try:
            return fn(*args)
        except CONNECTION_ERRORS as exc:
            self._check_refused(exc)
            first = exc
        try:
            return self._reconnect.call(what, lambda: fn(*args), first)
        except REFUSED as exc:
            raise self._refused(exc) from exc

    def _consumer_call(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn` now, or after reconnecting for as long as it takes; None if `wakeup()`.

        A consumer never gives up on its own: it keeps retrying (and logging) until Redis
        is back, so a worker cannot silently stop consuming; `wakeup()` ends the step.
        """
        try:
            return self._recovery.attempt(what, lambda: fn(*args), self._interrupted)
        except REFUSED as exc:
            raise self._refused(exc) from exc

    @staticmethod
    def _retryable(exc: BaseException) -> bool:
        return isinstance(exc, CONNECTION_ERRORS) and not isinstance(exc, REFUSED)

    def _check_refused(self, exc: BaseException) -> None:
        if isinstance(exc, REFUSED):
            raise self._refused(exc) from exc

    def _refused(self, exc: BaseException) -> BrokerError:
        return Refused(f"Redis at {redact(self._url)} {refusals.redis(exc)}; retrying "
                           "would not help")

    def _run(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run script `name` by EVALSHA straight on our connection.

        Calling the registered `Script` goes through redis-py's per-command layers, which
        here add about 100 µs, half a round trip, to every publish, claim and ack: this is
        the hot path. The connection still reconnects by itself after an error.
        """
        script = self._scripts[name]
        conn = self._client.connection
        if conn is None:
            raise BrokerError(f"{name} on a closed RedisBroker: open a new broker")
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except CONNECTION_ERRORS:
            self._reack_unread()  # their answers died with the connection
            raise
        redo = self._read_unread(conn) if self._unread else []
        try:
            reply = conn.read_response()
        except NoScriptError:  # the server restarted or its script cache was flushed
            conn.send_command("SCRIPT", "LOAD", script.script)
            script.sha = conn.read_response().decode()
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            reply = conn.read_response()
        if self._durable is not None and name in CONFIRMED:
            conn.send_command(*self._durable.command())
            self._confirmed(name, conn.read_response())
        if redo:
            self._reack(redo)
        return reply

    def _confirmed(self, name: str, acked: Any, count: int = 1) -> None:
        """Durable mode: raise NotConfirmed for a publish WAIT found short, warn for a
        settle (if lost in a failover, its message only runs again)."""
        assert self._durable is not None
        what = f"{name} of {count} message(s)" if count > 1 else name
        short = self._durable.shortfall(acked, what, redact(self._url))
        if short is None:
            return
        if name == "publish":
            raise NotConfirmed(f"{short}: publish again (a duplicate is possible, a loss is "
                               "not), or check the replicas (INFO replication)")
        log.warning("%s: the message may run again after a failover", short)

    def _run_many(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> None:
        """Script `name` once per (keys, args), pipelined: one round trip for all of them.

        Every reply is read before an error is raised, so the connection stays in step; the
        calls a flushed script cache refused are sent again once it is loaded.
        """
        script = self._scripts[name]
        conn = self._client.connection
        if conn is None:
            raise BrokerError(f"{name} on a closed RedisBroker: open a new broker")
        durable = self._durable is not None and name in CONFIRMED
        commands: list[tuple[Any, ...]] = [("EVALSHA", script.sha, len(keys), *keys, *args)
                                           for keys, args in calls]
        if durable:
            assert self._durable is not None
            commands.append(self._durable.command())   # one WAIT covers them all
        conn.send_packed_command(conn.pack_commands(commands))
        refused, error = [], None
        for call in calls:
            try:
                conn.read_response()
            except NoScriptError:
                refused.append(call)
            except redis.ResponseError as exc:
                error = error or exc
        acked = conn.read_response() if durable else None
        if error is not None:
            raise error
        if durable and not refused:
            self._confirmed(name, acked, len(calls))
        if refused:
            conn.send_command("SCRIPT", "LOAD", script.script)
            script.sha = conn.read_response().decode()
            self._run_many(name, refused)

    # -- the seam ------------------------------------------------------------------------

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        keys, args = self._publication(Publication(queue, body, priority, delay))
        self._call(f"publish to queue {queue!r}", self._run, "publish", keys, args)

    def publish_many(self, publications: Sequence[Publication]) -> None:
        """All of them in one round trip: the scripts pipelined on our connection."""
        calls = [self._publication(p) for p in publications]
        if calls:
            queues = sorted({p.queue for p in publications})
            self._call(f"publish {len(calls)} messages to {queues}", self._run_many, "publish",
                       calls)

    def _publication(self, p: Publication) -> tuple[list[str], list[Any]]:
        """The publish script's keys and arguments for `p`."""
        if not -PRIORITY_LIMIT <= p.priority <= PRIORITY_LIMIT:
            raise ValueError(f"priority {p.priority} of a message for queue {p.queue!r} is out "
                             f"of range: the Redis transport orders -{PRIORITY_LIMIT}.."
                             f"{PRIORITY_LIMIT}")
        keys = [self._key(p.queue, "ready"), self._key(p.queue, "delayed"),
                self._key(p.queue, "wake"), f"{self.prefix}:ids"]
        return keys, [f"{self.prefix}:m:", p.queue, p.body, int(p.priority), max(0.0, p.delay)]

    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        keys = [self._key(q, kind) for q in queues
                for kind in ("ready", "delayed", "inflight", "wake")]
        token = f"{self.connection_name}:{next(self._tokens)}"
        args = [f"{self.prefix}:m:", min(limit, CLAIM_MAX), self.lease_seconds, token]
        reply = self._consumer_call(f"claim from queues {list(queues)}", self._run, "claim",
                                    keys, args)
        if reply is None:
            return []
        due_ms, heads, *bodies = reply
        self._due_at = None if due_ms < 0 else time.monotonic() + due_ms / 1000
        return [self._delivery(queues, token, head, body)
                for head, body in zip(heads.split(b"\n"), bodies, strict=False)]

    def _delivery(self, queues: Sequence[str], token: str, head: bytes,
                  body: bytes) -> Delivery:
        """One claimed message from its reply line "id queue-index deliveries priority"."""
        message_id, index, deliveries, priority = head.decode().split(" ")
        queue = queues[int(index)]
        self._leases[message_id] = (queue, token)
        return Delivery(queue=queue, body=body, delivery_count=int(deliveries),
                        receipt=(message_id, token), priority=int(priority))

    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """BLPOP the queues' wake lists (only our private key while we may not claim)."""
        keys = [self._wake_key]
        if self._may_claim():
            keys = [*(self._key(q, "wake") for q in queues), self._wake_key]
            if self._due_at is not None:
                timeout = min(timeout, self._due_at - time.monotonic())
        timeout = min(timeout, WAIT_CAP)
        if timeout <= 0:
            return
        # Redis reads the timeout in whole milliseconds and 0 would mean "forever".
        timeout = max(0.001, math.ceil(timeout * 1000) / 1000)
        self._flush_unread()
        try:
            self._client.blpop(keys, timeout=timeout)
        except CONNECTION_ERRORS as exc:
            # The claim that follows reconnects, with backoff while Redis stays away.
            self._check_refused(exc)
            log.warning("waiting on queues %s: Redis at %s went away (%s); reconnecting",
                        list(queues), redact(self._url), one_line(exc))

    def _settle(self, action: str, delivery: Delivery, keys: list[str],
                args: Sequence[Any], *, final: bool = True) -> None:
        """Run a settle script with the delivery's lease token; LeaseLost if not ours."""
        message_id, token = delivery.receipt
        what = f"{action} of message {message_id} on queue {delivery.queue!r}"
        done = self._call(what, self._run, action, [self._message_key(message_id), *keys],
                          [message_id, token, *args])
        if final:
            self._leases.pop(message_id, None)
            self._settled()
        if not done:
            raise LeaseLost(f"{what}: it is no longer ours (its lease expired and another "
                            "consumer claimed it again, or the queue was purged); the outcome "
                            "was not recorded, the other consumer's will be")

    def ack(self, delivery: Delivery) -> None:
        q = delivery.queue
        self._settle("ack", delivery, [self._key(q, "inflight"), self._key(q, "ready")], [])

    def ack_soon(self, delivery: Delivery) -> None:
        """Send the ack now and read its answer with the next command's: one round trip.

        Replies come back in order on our one connection, so the next command (the
        consumer's next claim, usually) reads this answer first. If the connection fails
        before that, the ack is sent again on the new one (acking twice is harmless: the
        second finds nothing to remove)."""
        message_id, token = delivery.receipt
        conn = self._client.connection
        if conn is None or self._durable is not None:   # durable: the WAIT is the point
            self.ack(delivery)
            return
        try:
            conn.send_command("EVALSHA", self._scripts["ack"].sha, 3, *self._ack_keys(delivery),
                              message_id, token)
        except CONNECTION_ERRORS:
            self.ack(delivery)  # reconnects (with backoff) and acks on the new connection
            return
        self._unread.append(delivery)
        self._leases.pop(message_id, None)
        self._settled()

    def _ack_keys(self, delivery: Delivery) -> list[str]:
        q = delivery.queue
        return [self._message_key(delivery.receipt[0]), self._key(q, "inflight"),
                self._key(q, "ready")]

    def _read_unread(self, conn: Any) -> list[Delivery]:
        """Answers of acks sent ahead (see ack_soon); those to send again are returned (the
        caller's own answer is read first), or re-sent at once if the connection failed."""
        unread, self._unread = self._unread, []
        redo: list[Delivery] = []
        for i, delivery in enumerate(unread):
            try:
                done = conn.read_response()
            except NoScriptError:
                redo.append(delivery)
                continue
            except CONNECTION_ERRORS:
                self._reack(redo + unread[i:])
                raise
            if not done:
                log.warning("ack of message %s on queue %r: it was no longer ours (its lease "
                            "expired and another consumer claimed it again, or the queue was "
                            "purged); the other consumer's outcome will be recorded",
                            delivery.receipt[0], delivery.queue)
        return redo

    def _flush_unread(self) -> None:
        """Read the answers of acks sent ahead before a command that is not a script."""
        conn = self._client.connection
        if self._unread and conn is not None:
            try:
                redo = self._read_unread(conn)
            except CONNECTION_ERRORS:
                return  # already acked again on a new connection
            self._reack(redo)

    def _reack_unread(self) -> None:
        unread, self._unread = self._unread, []
        self._reack(unread)

    def _reack(self, deliveries: list[Delivery]) -> None:
        """After a connection failure: ack again what may not have arrived."""
        for delivery in deliveries:
            try:
                self._call("ack", self._run, "ack", self._ack_keys(delivery),
                           list(delivery.receipt))
            except BrokerError as exc:
                log.warning("ack of message %s could not be sent again (%s); it is redelivered "
                            "when its lease expires", delivery.receipt[0], exc)

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        q = delivery.queue
        keys = [self._key(q, kind) for kind in ("inflight", "ready", "delayed", "wake")]
        args = [max(0.0, delay), "0" if body is None else "1", body or b""]
        self._settle("retry_later", delivery, keys, args)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        q = delivery.queue
        keys = [self._key(q, kind) for kind in ("inflight", "ready", "dead")]
        self._settle("dead_letter", delivery, keys, [reason])

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        q = delivery.queue
        self._settle("extend_lease", delivery, [self._key(q, "inflight"), self._key(q, "ready")],
                     [seconds or self.lease_seconds], final=False)

    def depth(self, queue: str) -> Depth:
        keys = [self._key(queue, kind) for kind in ("ready", "delayed", "inflight", "dead")]
        counts = self._call(f"depth of queue {queue!r}", self._run, "depth", keys, [])
        return Depth(*(int(n) for n in counts))

    def peek(self, queue: str, limit: int) -> list[bytes] | None:
        return list(self._call(f"peek at queue {queue!r}", self._run, "peek",
                               [self._key(queue, "ready")], [f"{self.prefix}:m:", limit]))

    def _interrupt_wait(self) -> None:
        """Push our private wake key through wakeup()'s own connection (BLPOP holds ours).

        Signal handlers call this too (a worker's SIGTERM pauses it), on the consuming
        thread, possibly in the middle of an earlier nudge of that same thread: that nudge
        already wakes the consumer, and waiting for our own lock would deadlock.
        """
        me = threading.get_ident()
        if self._signal_owner == me:
            return
        try:
            with self._signal_lock:
                self._signal_owner = me
                try:
                    self._nudge()
                finally:
                    self._signal_owner = None
        except CONNECTION_ERRORS as exc:
            # Not retried here: wakeup() must return at once. The consumer's own connection
            # is failing too, and its retry loop stops as soon as it sees `_interrupted`.
            log.warning("Redis unreachable for wakeup() (%s: %s); the consumer's reconnect "
                        "loop will see the wake-up instead", type(exc).__name__, exc)

    def _nudge(self) -> None:
        if self._signal is None:
            self._signal = self._connect(self.connection_name + "-wakeup")
        self._scripts["nudge"](keys=[self._wake_key], args=[], client=self._signal)

    def close(self) -> None:
        """Give back unsettled deliveries (redelivered at once) and close both connections."""
        if self._closed:
            return
        self._closed = True
        try:
            self._flush_unread()
            self._give_back()
        finally:
            self._leases.clear()
            self._client.close()
            with self._signal_lock:
                if self._signal is not None:
                    self._signal.close()

    def _give_back(self) -> None:
        """Release held deliveries and drop our private wake key, in one best effort."""
        args: list[str] = [self.prefix]
        for message_id, (queue, token) in self._leases.items():
            args += [queue, message_id, token]
        try:
            if self._leases:
                self._run("release", [], args)
            if self._signal is not None:  # wakeup() was used: the key may hold a token
                self._client.delete(self._wake_key)
        except CONNECTION_ERRORS as exc:
            if self._leases:
                log.warning("Redis unreachable while closing (%s: %s): %d unsettled "
                            "deliveries will be redelivered when their leases expire, within "
                            "%g s", type(exc).__name__, exc, len(self._leases),
                            self.lease_seconds)

    # -- admin ---------------------------------------------------------------------------

    def dead_queues(self) -> list[str]:
        """From the keys: a queue's dead set exists only while it holds a letter."""
        head, tail = self._key("", "dead").split("::", 1)
        keys = self._call("listing queues with dead letters", lambda: list(
            self._client.scan_iter(match=f"{head}:*:{tail}", count=1000)))
        names = (k.decode() if isinstance(k, bytes) else str(k) for k in keys)
        return sorted({n[len(head) + 1:-len(tail) - 1] for n in names})

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        if limit <= 0:
            return []
        rows = self._call(f"listing dead letters of queue {queue!r}",
                          self._run, "dead_letters", [self._key(queue, "dead")],
                          [f"{self.prefix}:m:", limit])
        return [DeadLetter(id=rows[i].decode(), queue=queue, body=rows[i + 2],
                           reason=rows[i + 3].decode(), dead_at=float(rows[i + 1]),
                           delivery_count=int(rows[i + 4])) for i in range(0, len(rows), 5)]

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        keys = [self._key(queue, kind) for kind in ("dead", "ready", "wake")]
        return self._on_dead(f"requeueing dead letters of queue {queue!r}", "requeue_dead",
                             keys, ids)

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        return self._on_dead(f"deleting dead letters of queue {queue!r}", "purge_dead",
                             [self._key(queue, "dead")], ids)

    def _on_dead(self, what: str, script: str, keys: list[str],
                 ids: Sequence[str] | None) -> int:
        """Run an admin script over dead letters in batches: `ids`, or all of them."""
        total = 0
        if ids is not None:
            for start in range(0, len(ids), ADMIN_BATCH):
                chunk = [str(i) for i in ids[start:start + ADMIN_BATCH]]
                done, _ = self._call(what, self._run, script, keys,
                                     [f"{self.prefix}:m:", ADMIN_BATCH, *chunk])
                total += int(done)
            return total
        looked = ADMIN_BATCH
        while looked >= ADMIN_BATCH:
            done, looked = self._call(what, self._run, script, keys,
                                      [f"{self.prefix}:m:", ADMIN_BATCH])
            total += int(done)
        return total

    def purge(self, queue: str) -> int:
        keys = [self._key(queue, kind)
                for kind in ("ready", "delayed", "inflight", "dead", "wake")]
        total, more = 0, 1
        while more:
            deleted, more = self._call(f"purge of queue {queue!r}", self._run, "purge", keys,
                                       [f"{self.prefix}:m:", ADMIN_BATCH])
            total += int(deleted)
        return total
