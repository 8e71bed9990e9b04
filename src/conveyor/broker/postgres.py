"""Postgres transport: queues in one table, claimed with `FOR UPDATE SKIP LOCKED`.

URL: `postgresql://user@host:5432/db?schema=conveyor&ack_commit=async&retry_seconds=60`.
Conveyor's options: `schema` (default `conveyor`) holds the tables, created and migrated on
first use; `ack_commit` is `async` (default) or `sync`, see Durability; `retry_seconds`, see
Connection loss; `vacuum_every` (default 10000, 0: never), see Backlog. Every other option
goes to libpq (broker/pgurl.py reads the URL).

* Claim: one statement locks up to `limit` ready rows (priority, then age) with
  `SKIP LOCKED` and leases them: `locked_until` plus a per-claim token that ack, retry,
  dead-letter and heartbeat must present, so a consumer whose lease expired cannot settle a
  message someone else now owns (`LeaseLost`). An expired lease is ready again: crash recovery.
  The base loop asks for `prefetch - outstanding` at once, so one round trip serves a batch;
  a consumer reading ahead (a worker, `--read-ahead`) asks for that many more while its
  claims took more than `prefetch` rows in the last READ_AHEAD_WINDOW (short tasks), and
  holds them leased.
* Acks: `ack_soon` owes the ack to the next claim, whose statement deletes the acked rows
  and leases the next ones (one round trip, one commit); owed OWED_SECONDS without a claim,
  or before the consumer waits or closes, they go as one `ack_many`. A worker killed with
  acks owed has those messages delivered again when their leases expire (at-least-once).
* Backlog: a claim costs the same with ten rows queued or a million, whatever the
  planner's statistics say: it reads the head of an index that holds only ready rows, in
  that index's order (sql/postgres.sql says how), and the consumer vacuums the table every
  `vacuum_every` claims so that dead entries do not pile up at that head (`pgvacuum.py`).
* Durability: publish, retry, dead-letter and heartbeat return after their commit is flushed
  (`synchronous_commit` as the server has it). Two commits do not wait for the flush, because
  losing them can only cause a redelivery, never a loss (unless `ack_commit=sync`):
  - the claim: lost to a Postgres crash, the row is simply ready again (its task may run);
  - the ack, unless `ack_commit=sync`: when `ack` returns the row is deleted and committed,
    so a consumer crash afterwards loses nothing and no one else can claim the message; but
    if Postgres or its host crashes (or fails over to a standby) within the WAL writer's
    flush interval (3 x `wal_writer_delay`, 600 ms by default), the deletion is undone and
    the message is delivered again once its lease expires, with its delivery count grown.
    That halves the cost of an ack; the worker's outcome was recorded before it acked, so a
    redelivery finds it. `ack_commit=sync`: acks and claims wait for the flush (and a sync
    standby); the default when the URL names several hosts (pgurl.py, pgfailover.py).
* Wake-up: every write that makes work available sends `NOTIFY conveyor_<schema>, '<queue>'`
  in its transaction (Postgres folds duplicates, and delivers only on commit). A consumer
  LISTENs on a second, autocommit connection and sleeps in `select()` on its socket and a
  self-pipe (`wakeup()`), for at most the time until its next delayed row or lease is due, and
  never longer than `POLL_FALLBACK`.
* Connection loss: the operation reconnects with backoff (`broker/reconnect.py`), logging one
  WARNING line per attempt, for up to `retry_seconds` (URL option, default 60), then raises
  `BrokerConnectionError`; the consume loop (claim, LISTEN) retries for as long as the outage
  lasts, until `wakeup()`. A consumer re-LISTENs and claims at once after a reconnect, since
  notifications sent while it was away are gone. A publish or claim cut off mid-commit may
  have happened: the publish is sent again (at-least-once: a duplicate, never a loss) and a
  claimed row comes back when its lease expires.
"""

from __future__ import annotations

import logging
import os
import re
import select
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from conveyor import refusals, sqlfiles
from conveyor.broker import pgvacuum
from conveyor.broker.base import (
    DEFAULT_LEASE_SECONDS,
    Broker,
    DeadLetter,
    Delivery,
    Depth,
    Publication,
)
from conveyor.broker.pgurl import parse_url
from conveyor.broker.reconnect import Reconnect, Recovery
from conveyor.errors import BrokerConnectionError, BrokerError, LeaseLost
from conveyor.locations import redact
from conveyor.pgfailover import is_connection_loss

log = logging.getLogger(__name__)
T = TypeVar("T")
Connection = psycopg.Connection[Any]
Cursor = psycopg.Cursor[Any]

Q = sqlfiles.load("conveyor.broker", "sql/postgres.sql")
#: (version, query name) of every schema migration, in order.
MIGRATIONS = sorted((int(m[1]), m[0]) for name in Q
                    if (m := re.fullmatch(r"migration_(\d+)", name)))
#: Longest sleep without a wake-up: a safety net should a notification ever be missed.
POLL_FALLBACK = 5.0
#: The longest an ack waits for a claim to carry it (seconds; see ack_soon): a worker killed
#: meanwhile has that message delivered again, as one killed before its ack would.
OWED_SECONDS = 0.05
#: A consumer that claimed more than `prefetch` rows in this many seconds claims `ahead` more
#: rows than it has free slots (a worker's --read-ahead): see PostgresBroker._reads_ahead.
READ_AHEAD_WINDOW = 0.05
class PostgresBroker(Broker):
    """Queues in one Postgres table per schema; see the module docstring for the design."""

    leases = True

    def __init__(self, url: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        super().__init__(lease_seconds)
        self.url = redact(url)
        self.settings = parse_url(url)
        self._ack_many_query = self.settings.ack_query.replace("ack", "ack_many", 1)
        self.schema = self.settings.schema
        self._reconnect = Reconnect(f"the Postgres broker at {self.url}", log,
                                    is_connection_loss, self.settings.retry_seconds,
                                    refusals.postgres, stopping=self._stopping)
        self._recovery = Recovery(self._reconnect)  # a consumer's, across its steps
        self._channel = f"conveyor_{self.schema}"
        #: Starts every application_name of this broker: find its sessions in pg_stat_activity.
        prefix = self.settings.params.get("application_name") or "conveyor"
        self.name = f"{prefix}:{uuid.uuid4().hex[:8]}"
        self._leases: dict[int, uuid.UUID] = {}  # row id -> lease token, for release on close
        self._owed: list[Delivery] = []  # acked with ack_soon, sent with the next claim
        self._owed_since = 0.0  # monotonic: when the first of them was owed
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic, rows): _reads_ahead
        self._closed = False
        self._listener: Connection | None = None
        self._next_read = 0.0  # monotonic time to read piled-up notifications again
        self._pipe_r, self._pipe_w = os.pipe()
        for fd in (self._pipe_r, self._pipe_w):
            os.set_blocking(fd, False)
        self._cur: Cursor | None = None
        self._vacuum = pgvacuum.Vacuum(
            make_conninfo(**{**self.settings.params, "application_name": f"{self.name}:vacuum"}),
            float(self.settings.params["connect_timeout"]) or 60.0,  # libpq: 0 is no limit
            self.settings.vacuum_every, self.url)
        try:
            self._cur = self._reconnect.call("connecting", lambda: self._connect("main").cursor())
        except psycopg.OperationalError as exc:
            self._close_pipe()
            raise BrokerConnectionError(
                f"cannot connect to the Postgres broker at {self.url}: {_one_line(exc)}; "
                "check the URL, that the server is up, and that it accepts this user") from exc
        except BaseException:
            self._close_pipe()
            raise
        try:
            self._run("schema migration", lambda cur: self._migrate(cur.connection))
        except psycopg.Error as exc:
            self.close()
            raise BrokerError(
                f"cannot create or migrate the broker schema {self.schema!r} at {self.url}: "
                f"{_one_line(exc)}; start a broker once as a user allowed to create schemas "
                "in this database, or ask its owner to") from exc
        except BaseException:
            self.close()
            raise

    # -- connections and schema -----------------------------------------------------------

    def _connect(self, role: str) -> Connection:
        """A new autocommit session; its application_name says whose and what for."""
        return psycopg.connect(**{**self.settings.params,
                                  "application_name": f"{self.name}:{role}"}, autocommit=True)

    def _migrate(self, conn: Connection) -> None:
        """Create or upgrade the schema, unless it is current (then no lock, no DDL rights)."""
        if self._schema_version(conn) >= MIGRATIONS[-1][0]:
            return
        with conn.transaction():
            conn.execute(Q["migration_lock"], {"schema": self.schema})
            conn.execute(sql.SQL(Q["create_schema"]).format(schema=sql.Identifier(self.schema)))
            current = self._schema_version(conn)
            for version, name in MIGRATIONS:
                if version > current:
                    conn.execute(Q[name])
                    conn.execute(Q["record_migration"], {"version": version})
                    log.info("Postgres broker schema %r migrated to version %d",
                             self.schema, version)

    @staticmethod
    def _schema_version(conn: Connection) -> int:
        """The applied schema version; 0 when the schema or its migrations table is missing."""
        if conn.execute("SELECT to_regclass('conveyor_migrations')").fetchone() == (None,):
            return 0
        row = conn.execute(Q["schema_version"]).fetchone()
        return int(row[0]) if row else 0

    def _run(self, what: str, fn: Callable[[Cursor], T]) -> T:
        """`fn(cursor of the main session)`; if the session is lost, reconnect and run it again
        for up to `retry_seconds`.

        The happy path costs one check: no retry machinery around every ack.
        """
        cur = self._cur
        if cur is not None and not cur.connection.closed:
            try:
                return fn(cur)
            except psycopg.Error as exc:
                if not (cur.connection.closed or is_connection_loss(exc)):
                    raise
                cur.connection.close()
                return self._reconnect.call(what, lambda: self._on_main(fn), exc)
        return self._reconnect.call(what, lambda: self._on_main(fn))

    def _consumer_run(self, what: str, fn: Callable[[Cursor], T]) -> T | None:
        """`_run` for the consume loop: it retries for as long as the outage lasts (a worker
        outlives it), and returns None when `wakeup()` interrupts it."""
        return self._recovery.attempt(what, lambda: self._on_main(fn), self._interrupted)

    def _on_main(self, fn: Callable[[Cursor], T]) -> T:
        """`fn(main cursor)`; a lost session (or one on a standby) is closed: the next opens."""
        cur = self._main_cursor()
        try:
            return fn(cur)
        except psycopg.Error as exc:
            if is_connection_loss(exc) and not cur.connection.closed:
                cur.connection.close()
            raise

    def _main_cursor(self) -> Cursor:
        """The main session's cursor, reconnected if the session is gone."""
        if self._closed:
            raise BrokerError(f"the Postgres broker for {self.url} is closed; open a new one")
        if self._cur is None or self._cur.connection.closed:
            if self._cur is not None:
                self._cur.connection.close()
            self._cur = self._connect("main").cursor()
        return self._cur

    # -- the seam -----------------------------------------------------------------------

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        params = {"queue": queue, "body": body, "priority": priority,
                  "delay": max(0.0, delay), "channel": self._channel}
        self._run("publish", lambda cur: cur.execute(Q["publish"], params))

    def publish_many(self, publications: Sequence[Publication]) -> None:
        """All of them in one transaction: one flush to disk, not one per message (a
        scheduler dispatching a wide fan-out). All or none is stored; a retry after a lost
        connection may store them twice (at-least-once)."""
        if not publications:
            return
        rows = [{"queue": p.queue, "body": p.body, "priority": p.priority,
                 "delay": max(0.0, p.delay), "channel": self._channel} for p in publications]
        queues = sorted({p.queue for p in publications})

        def publish(cur: Cursor) -> None:
            with cur.connection.transaction():
                cur.executemany(Q["publish"], rows)

        self._run(f"publish {len(rows)} messages to {queues}", publish)

    def _start_consuming(self, queues: Sequence[str], prefetch: int) -> None:
        if self._listener is None:
            self._listener = self._recovery.attempt("LISTEN", self._listen, self._interrupted)

    def _listen(self) -> Connection:
        """A fresh session LISTENing on this schema's channel."""
        if self._closed:
            raise BrokerError(f"the Postgres broker for {self.url} is closed; open a new one")
        conn = self._connect("listen")
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _reads_ahead(self) -> int:
        """`ahead` while this consumer claimed more than `prefetch` rows in the last
        READ_AHEAD_WINDOW (short tasks, where a round trip per task is what bounds a worker),
        else 0: a slow consumer's claim takes only what its free slots start now, and holds
        nothing back from another consumer. Rows, not claims: slots of long tasks that free
        together claim one each in a burst, never more than `prefetch` rows."""
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > READ_AHEAD_WINDOW:
            self._recent.popleft()
        return self._ahead if sum(n for _, n in self._recent) > self._prefetch else 0

    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        self._read_piled_up_notifications()
        lease = uuid.uuid4()
        claimed: list[Delivery] = []
        for queue in queues:
            claimed += self._claim_from(queue, limit - len(claimed), lease)
            if len(claimed) >= limit:
                break
        for delivery in claimed:
            self._leases[delivery.receipt[0]] = lease
        self._vacuum.claimed(len(claimed))
        if claimed:
            self._recent.append((time.monotonic(), len(claimed)))
        return claimed

    def _claim_from(self, queue: str, limit: int, lease: uuid.UUID) -> list[Delivery]:
        """One claim statement on one queue, in delivery order; it carries the owed acks."""
        owed = list(self._owed)
        params = {"queue": queue, "limit": limit, "lease": lease,
                  "lease_seconds": self.lease_seconds, **self._ack_params(owed)}
        rows = self._consumer_run("claim", lambda cur: cur.execute(Q["claim"], params)
                                  .fetchall())
        if rows is None:
            return []  # woken while Postgres is away: the acks stay owed
        self._sent(owed, {r[1] for r in rows if r[0] == "acked"})
        claimed = sorted((r[1:] for r in rows if r[0] == "claimed"),
                         key=lambda r: (-r[3], r[0]))  # RETURNING order is not guaranteed
        return [Delivery(queue=queue, body=r[1], delivery_count=r[2], receipt=(r[0], lease),
                         priority=r[3]) for r in claimed]

    def _ack_params(self, owed: list[Delivery]) -> dict[str, Any]:
        """The claim's acks: ids, leases, and whether its commit waits for the flush (with
        ack_commit=sync, always: a claim undone by a failover would run its task again)."""
        return {**_receipts(owed), "flush": self.settings.ack_query == "ack"}

    def _sent(self, owed: list[Delivery], gone: set[int]) -> None:
        """`owed` reached Postgres, which deleted the rows `gone`; the others were not ours."""
        del self._owed[:len(owed)]
        self._owed_since = time.monotonic()  # for those owed meanwhile, if any
        for delivery in owed:
            if delivery.receipt[0] not in gone:
                log.warning("ack of message %s on queue %r: it was no longer ours (its lease "
                            "expired and another consumer claimed it again, or the queue was "
                            "purged); the other consumer's outcome will be recorded",
                            delivery.receipt[0], delivery.queue)

    def _read_piled_up_notifications(self) -> None:
        """Once a second, read what a busy consumer (one that never waits) was sent.

        Why: Postgres cannot truncate its notification queue, shared by the whole cluster,
        past a listener that stopped reading; unread, it grows by every NOTIFY anywhere.
        """
        now = time.monotonic()
        if self._listener is None or now < self._next_read:
            return
        self._next_read = now + 1.0
        if select.select([self._listener.fileno()], [], [], 0)[0]:
            self._notified(self._listener, set())  # we claim anyway: only the reading counts

    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """Sleep until a NOTIFY for one of `queues`, a wake-up, a due row, or `timeout`."""
        if not self.send_owed():
            return  # woken while Postgres is away
        seconds = min(timeout, POLL_FALLBACK)
        if self._may_claim():  # a claim comes next
            due = self._consumer_run("wait", lambda cur: cur.execute(
                Q["seconds_until_due"], {"queues": list(queues)}).fetchone())
            if due is not None and due[0] is not None:
                seconds = min(seconds, max(0.001, due[0]))
        self._sleep(set(queues), seconds)

    def _sleep(self, queues: set[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            listener = self._listener or self._recovery.attempt("LISTEN", self._listen,
                                                                self._interrupted)
            if listener is None:
                return  # woken while Postgres is away
            self._listener = listener
            readable, _, _ = select.select([listener.fileno(), self._pipe_r], [], [], remaining)
            if self._pipe_r in readable:
                self._drain_pipe()
                return
            if readable and self._notified(listener, queues):
                return

    def _notified(self, listener: Connection, queues: set[str]) -> bool:
        """Read what arrived; True if `queues` may have new work (or we had to reconnect)."""
        try:
            payloads = _read_notifications(listener)
        except psycopg.OperationalError as exc:
            log.warning("Postgres connection lost while listening for new messages on %s "
                        "(%s); reconnecting and listening again", self.url, _one_line(exc))
            listener.close()
            self._listener = None
            self._listener = self._recovery.attempt("LISTEN", self._listen, self._interrupted)
            return True  # notifications sent meanwhile are lost: claim now to be sure
        return not queues.isdisjoint(payloads)

    def _settle(self, delivery: Delivery, query: str, **params: Any) -> None:
        row_id, lease = delivery.receipt
        args = {"id": row_id, "lease": lease, "channel": self._channel, **params}
        count = self._run(query, lambda cur: cur.execute(Q[query], args).rowcount)
        if query != "extend_lease":
            self._leases.pop(row_id, None)
            self._settled()
        if count != 1:
            raise LeaseLost(f"{query} of message {row_id} on queue {delivery.queue!r}: its "
                            "lease expired and it was claimed again (or, if the connection "
                            "was lost just now, this was recorded before); do not assume the "
                            "outcome was recorded, the other consumer's will be")

    def ack(self, delivery: Delivery) -> None:
        self._settle(delivery, self.settings.ack_query)

    def ack_soon(self, delivery: Delivery) -> None:
        """Owe the ack: the consumer's next claim carries it (one statement, one round trip
        and one commit for both, and a worker reading ahead claims once per batch), or
        `send_owed` once it has been owed OWED_SECONDS (see `owed_for`), or before the
        consume loop waits. Until then the row stays leased to us: were this process
        killed, the message would be delivered again once the lease expires
        (at-least-once), as when it is killed before `ack`. A lease lost by then is logged,
        not raised."""
        self._leases.pop(delivery.receipt[0], None)
        if not self._owed:
            self._owed_since = time.monotonic()
        self._owed.append(delivery)
        self._settled()

    @property
    def owed_for(self) -> float | None:
        return self._owed_since + OWED_SECONDS - time.monotonic() if self._owed else None

    def send_owed(self) -> bool:
        """One statement for the owed acks; retried for as long as Postgres is away, False
        if `wakeup()` interrupts that (they stay owed)."""
        owed = list(self._owed)
        if not owed:
            return True
        query, params = self._ack_many_query, _receipts(owed)
        rows = self._consumer_run("ack", lambda cur: cur.execute(Q[query], params).fetchall())
        if rows is None:
            return False
        self._sent(owed, {row[0] for row in rows})
        return True

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[Delivery]:
        """One statement for them all, committed as `ack` is (ack_commit)."""
        if not deliveries:
            return []
        query, params = self._ack_many_query, _receipts(deliveries)
        gone = {row[0] for row in self._run(query, lambda cur: cur.execute(
            Q[query], params).fetchall())}
        for delivery in deliveries:
            self._leases.pop(delivery.receipt[0], None)
            self._settled()
        return [d for d in deliveries if d.receipt[0] not in gone]

    def _return_unhanded(self, buffered: list[Delivery]) -> None:
        """One statement for what a claim read ahead and nobody started: ready at once."""
        if not buffered:
            return
        for delivery in buffered:
            self._leases.pop(delivery.receipt[0], None)
        params = {**_receipts(buffered), "channel": self._channel}
        try:
            self._run("give back", lambda cur: cur.execute(Q["release"], params))
        except BrokerError as exc:
            log.warning("could not give back %d deliveries claimed ahead (%s); they return "
                        "when their leases expire, within %g s", len(buffered), exc,
                        self.lease_seconds)

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        self._settle(delivery, "retry_later", delay=max(0.0, delay), body=body)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self._settle(delivery, "dead_letter", reason=reason)

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        self._settle(delivery, "extend_lease", seconds=seconds or self.lease_seconds)

    def depth(self, queue: str) -> Depth:
        row = self._run("depth", lambda cur: cur.execute(Q["depth"], {"queue": queue})
                        .fetchone())
        assert row is not None, "an aggregate always returns a row"
        return Depth(*(int(v) for v in row))

    def peek(self, queue: str, limit: int) -> list[bytes] | None:
        rows = self._run("peek", lambda cur: cur.execute(Q["peek"], {
            "queue": queue, "limit": limit}).fetchall())
        return [bytes(r[0]) for r in rows]

    def watch(self, queues: Sequence[str], timeout: float, *, above: int = 0) -> bool:
        """LISTEN as a consumer does: a NOTIFY reaches every listener, so an autoscaler
        watching here learns of new work at once and takes nothing from the consumers."""
        self._start_consuming(queues, 1)
        return self._watch_depth(queues, timeout, above, self._wait)

    def _interrupt_wait(self) -> None:
        try:
            os.write(self._pipe_w, b"!")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already
        except OSError:
            pass  # closed (fd -1): nobody is waiting any more

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._pipe_r, 512):
                pass
        except BlockingIOError:
            return

    def close(self) -> None:
        """Give back unsettled deliveries (ready at once), then close both sessions."""
        self._unhanded.clear()  # claimed ahead: leased, so given back with the rest here
        self._release_held()
        self._closed = True
        self._vacuum.close()
        for conn in (self._listener, self._cur.connection if self._cur else None):
            if conn is not None:
                conn.close()
        self._listener = self._cur = None
        self._close_pipe()

    def _release_held(self) -> None:
        """Send the owed acks, then give back the rest, in one statement each and without
        reconnecting: close() must not hang on a dead server. Owed acks that do not arrive
        are not given back: those messages come back when their leases expire."""
        self._send_owed_closing()
        if not self._leases:
            return
        held = list(self._leases.items())
        self._leases.clear()
        params = {"ids": [i for i, _ in held], "leases": [lease for _, lease in held],
                  "channel": self._channel}
        try:
            if self._cur is None or self._cur.connection.closed:
                raise psycopg.OperationalError("the connection is closed")
            self._cur.execute(Q["release"], params)
        except psycopg.Error as exc:
            log.warning("could not give back %d unsettled deliveries on close (%s); they will "
                        "be redelivered when their leases expire, within %g s",
                        len(held), _one_line(exc), self.lease_seconds)

    def _send_owed_closing(self) -> None:
        owed, self._owed = self._owed, []
        if not owed:
            return
        try:
            if self._cur is None or self._cur.connection.closed:
                raise psycopg.OperationalError("the connection is closed")
            self._cur.execute(Q[self._ack_many_query], _receipts(owed))
        except psycopg.Error as exc:
            log.warning("could not send %d acks on close (%s); those messages are delivered "
                        "again when their leases expire, within %g s",
                        len(owed), _one_line(exc), self.lease_seconds)

    def _close_pipe(self) -> None:
        for fd in (self._pipe_r, self._pipe_w):
            if fd >= 0:
                os.close(fd)
        self._pipe_r = self._pipe_w = -1

    # -- admin ------------------------------------------------------------------------------

    def dead_queues(self) -> list[str]:
        rows = self._run("dead_queues", lambda cur: cur.execute(Q["dead_queues"]).fetchall())
        return [row[0] for row in rows]

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        rows = self._run("dead_letters", lambda cur: cur.execute(
            Q["dead_letters"], {"queue": queue, "limit": limit}).fetchall())
        return [DeadLetter(id=str(r[0]), queue=r[1], body=r[2], reason=r[3], dead_at=r[4],
                           delivery_count=r[5]) for r in rows]

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        params = {"queue": queue, "ids": _numbers(queue, ids), "channel": self._channel}
        row = self._run("requeue_dead", lambda cur: cur.execute(Q["requeue_dead"], params)
                        .fetchone())
        return int(row[0]) if row else 0

    def purge(self, queue: str) -> int:
        return self._run("purge", lambda cur: cur.execute(Q["purge"], {"queue": queue})
                         .rowcount)

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        params = {"queue": queue, "ids": _numbers(queue, ids)}
        return self._run("purge_dead", lambda cur: cur.execute(Q["purge_dead"], params)
                         .rowcount)


def _receipts(deliveries: Sequence[Delivery]) -> dict[str, list[Any]]:
    """The ids and lease tokens of `deliveries`, as the ack_many and claim queries take them."""
    return {"ids": [d.receipt[0] for d in deliveries],
            "leases": [d.receipt[1] for d in deliveries]}


def _numbers(queue: str, ids: Sequence[str] | None) -> list[int] | None:
    """Dead-letter ids as the numbers they are on Postgres (None: all of them)."""
    try:
        return None if ids is None else [int(i) for i in ids]
    except ValueError as exc:
        raise ValueError(f"dead letters of queue {queue!r}: ids are the numbers "
                         f"dead_letters() returns, got {list(ids or [])!r}") from exc


def _read_notifications(listener: Connection) -> set[str]:
    """Payloads that have arrived, without blocking; OperationalError if the session is gone
    (libpq directly: `Connection.notifies(timeout=0)` would do, but needs psycopg 3.2)."""
    listener.pgconn.consume_input()
    payloads = set()
    while (notify := listener.pgconn.notifies()) is not None:
        payloads.add(notify.extra.decode(listener.info.encoding, "replace"))
    return payloads


def _one_line(exc: BaseException | None) -> str:
    """libpq messages span lines; a log line should not."""
    return " ".join(str(exc).split()) if exc is not None else "unknown error"
