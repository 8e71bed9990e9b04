"""SQLite transport: the embedded default, safe for several processes on one host.

WAL mode; a claim is one `UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING` inside
`BEGIN IMMEDIATE`, so two processes can never claim the same row. A claim sets a lease
(`locked_until`) and a per-claim token: acks and heartbeats must present the token, so a
consumer whose lease expired cannot settle a message someone else now owns. Expired leases
are simply claimable again, which is the whole crash-recovery story. Consumers sleep on a
`WakeChannel` socket that publishers ping after each commit.

Outage: a database file another process keeps write-locked (a long transaction, a backup)
past the busy timeout (`BUSY_TIMEOUT`) is this transport's outage. A settle, heartbeat or
publish then raises `BrokerConnectionError` as a lost connection does on the other
transports (a worker holds the settle and skips the heartbeat), and a claim finds nothing
and is tried again after the consumer's wait, instead of sqlite3's error stopping the worker.

Durability: `synchronous=NORMAL` in WAL mode survives any process crash; a power loss may
drop the last commits. Set `?synchronous=FULL` in the URL to trade speed for that.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from conveyor import sqlfiles
from conveyor.broker.base import (
    DEFAULT_LEASE_SECONDS,
    Broker,
    DeadLetter,
    Delivery,
    Depth,
    Publication,
)
from conveyor.broker.wake import WakeChannel
from conveyor.errors import BrokerConnectionError, LeaseLost
from conveyor.locations import path_from_url

Q = sqlfiles.load("conveyor.broker", "sql/sqlite.sql")
log = logging.getLogger("conveyor.broker.sqlite")
#: Seconds a statement waits for another process's write lock before it gives up.
BUSY_TIMEOUT = 30.0
#: Longest sleep without a wake-up: a safety net should a datagram ever be lost.
POLL_FALLBACK = 5.0


class SQLiteBroker(Broker):
    """Queues in one SQLite file."""

    leases = True

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self.path, options = path_from_url(url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={options.get('synchronous', 'NORMAL')}")
        self._db.executescript(Q["schema"])
        self._wake = WakeChannel(self.path.with_name(self.path.name + ".wake"))
        self._leases: dict[int, str] = {}  # row id -> lease token, for release on close

    # -- the seam -----------------------------------------------------------------------

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        with self._unless_locked(f"publish to queue {queue!r}"):
            self._db.execute(Q["publish"], {"queue": queue, "body": body,
                                            "priority": priority,
                                            "available_at": time.time() + max(0.0, delay)})
        self._wake.notify_all()

    def publish_many(self, publications: Sequence[Publication]) -> None:
        """All of them in one transaction, then one wake-up: a scheduler dispatching a wide
        fan-out commits once and wakes each consumer once, not once per message. All or
        none is stored."""
        if not publications:
            return
        now = time.time()
        rows = [{"queue": p.queue, "body": p.body, "priority": p.priority,
                 "available_at": now + max(0.0, p.delay)} for p in publications]
        with self._unless_locked(f"publish of {len(rows)} messages"), self._transaction():
            self._db.executemany(Q["publish"], rows)
        self._wake.notify_all()

    def _start_consuming(self, queues: Sequence[str], prefetch: int) -> None:
        self._wake.listen()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """`BEGIN IMMEDIATE` (the write lock at once, so two claimers never read the same
        rows) ... `COMMIT`, or `ROLLBACK` on any error."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    @contextmanager
    def _unless_locked(self, what: str) -> Iterator[None]:
        """sqlite3's error for a file locked past the busy timeout, as the outage it is."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_BUSY", "SQLITE_LOCKED") \
                    and "locked" not in str(exc):
                raise
            raise BrokerConnectionError(
                f"{what}: the SQLite database {self.path} stayed locked by another process "
                f"for {BUSY_TIMEOUT:g} s ({exc}); find what holds its write lock (a long "
                "transaction, a backup, a process stopped mid-write)") from None

    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        try:
            return self._claim_now(queues, limit)
        except BrokerConnectionError as exc:
            log.warning("%s; claiming again after the next wait", exc)
            return []

    def _claim_now(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        lease = uuid.uuid4().hex
        now = time.time()
        claimed: list[Delivery] = []
        with self._unless_locked(f"claim from {', '.join(queues)}"), self._transaction():
            for queue in queues:
                rows = self._db.execute(Q["claim"], {
                    "queue": queue, "now": now, "lease_seconds": self.lease_seconds,
                    "lease": lease, "limit": limit - len(claimed)}).fetchall()
                rows.sort(key=lambda r: (-r[4], r[0]))  # RETURNING order is not guaranteed
                claimed += [Delivery(queue=r[1], body=r[2], delivery_count=r[3],
                                     receipt=(r[0], lease), priority=r[4]) for r in rows]
                if len(claimed) >= limit:
                    break
        for delivery in claimed:
            self._leases[delivery.receipt[0]] = lease
        return claimed

    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """Sleep until a publish, a wake-up, a due message, or `timeout`."""
        if not self._may_claim():
            self._wake.wait(min(timeout, POLL_FALLBACK))
            return None
        now = time.time()
        due = [self._db.execute(Q["next_due"], {"queue": q}).fetchone()[0] for q in queues]
        next_due = min((d for d in due if d is not None), default=now + POLL_FALLBACK)
        self._wake.wait(min(timeout, max(0.001, next_due - now), POLL_FALLBACK))
        return None

    def _settle(self, delivery: Delivery, query: str, **params: Any) -> None:
        row_id, lease = delivery.receipt
        with self._unless_locked(f"{query} of message {row_id} on queue {delivery.queue!r}"):
            cursor = self._db.execute(Q[query], {"id": row_id, "lease": lease,
                                                 "now": time.time(), **params})
        if query != "extend_lease":
            self._leases.pop(row_id, None)
            self._settled()
        if cursor.rowcount != 1:
            raise LeaseLost(f"{query} of message {row_id} on queue {delivery.queue!r}: its "
                            "lease expired and it was claimed again; the outcome was not "
                            "recorded, the other consumer's will be")

    def ack(self, delivery: Delivery) -> None:
        self._settle(delivery, "ack")

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[Delivery]:
        """One transaction for them all (one commit instead of one per message)."""
        with self._unless_locked(f"ack of {len(deliveries)} messages"), self._transaction():
            lost = [d for d in deliveries if self._db.execute(Q["ack"], {
                "id": d.receipt[0], "lease": d.receipt[1]}).rowcount != 1]
        for delivery in deliveries:
            self._leases.pop(delivery.receipt[0], None)
            self._settled()
        return lost

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        self._settle(delivery, "retry_later", delay=max(0.0, delay), body=body)
        self._wake.notify_all()

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._settle(delivery, "dead_letter", reason=reason)

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        self._settle(delivery, "extend_lease", seconds=seconds or self.lease_seconds)

    def depth(self, queue: str) -> Depth:
        row = self._db.execute(Q["depth"], {"queue": queue, "now": time.time()}).fetchone()
        return Depth(*(int(v) for v in row))

    def peek(self, queue: str, limit: int) -> list[bytes] | None:
        rows = self._db.execute(Q["peek"], {"queue": queue, "now": time.time(), "limit": limit})
        return [bytes(r[0]) for r in rows]

    def watch(self, queues: Sequence[str], timeout: float, *, above: int = 0) -> bool:
        """Sleep on the wake channel as a consumer does: every listener gets each publish's
        ping, so an autoscaler watching here learns of new work at once and takes nothing."""
        self._wake.listen()
        return self._watch_depth(queues, timeout, above, self._wait)

    def _interrupt_wait(self) -> None:
        self._wake.wake_self()

    def close(self) -> None:
        for row_id, lease in list(self._leases.items()):
            self._db.execute(Q["release"], {"id": row_id, "lease": lease})
        if self._leases:
            self._wake.notify_all()
        self._leases.clear()
        self._wake.close()
        self._db.close()

    # -- admin ------------------------------------------------------------------------------

    def dead_queues(self) -> list[str]:
        return [row[0] for row in self._db.execute(Q["dead_queues"])]

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        rows = self._db.execute(Q["dead_letters"], {"queue": queue, "limit": limit})
        return [DeadLetter(id=str(r[0]), queue=r[1], body=r[2], reason=r[3], dead_at=r[4],
                           delivery_count=r[5]) for r in rows]

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        now = time.time()
        if ids is None:
            count = self._db.execute(Q["requeue_dead"], {"queue": queue, "now": now,
                                                         "all": 1, "id": None}).rowcount
        else:
            count = sum(self._db.execute(Q["requeue_dead"], {
                "queue": queue, "now": now, "all": 0, "id": int(i)}).rowcount for i in ids)
        self._wake.notify_all()
        return count

    def purge(self, queue: str) -> int:
        return int(self._db.execute(Q["purge"], {"queue": queue}).rowcount)

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        if ids is None:
            return int(self._db.execute(Q["purge_dead"], {"queue": queue, "all": 1,
                                                          "id": None}).rowcount)
        return sum(self._db.execute(Q["purge_dead"], {"queue": queue, "all": 0,
                                                      "id": int(i)}).rowcount for i in ids)
