"""The SQL limiters: SQLite (the embedded default) and Postgres, one algorithm for both.

Every operation is one transaction that first takes the store's write lock: `BEGIN
IMMEDIATE` on SQLite, a transaction-scoped advisory lock per schema on Postgres. Limiter
operations are a few small statements each, so one lock for all keys costs little and can
never deadlock; what it buys is that "is there room?" and "take it" are one step.

Tables (`sql/limits.sql`): keys (declared spec, run-time override, GCRA state, denied count),
tokens (key, holder, weight, expiry) and parked messages (the waiting areas).
"""

from __future__ import annotations

import abc
import contextlib
import json
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor import refusals, sqlfiles
from conveyor.errors import ConfigError
from conveyor.flow import Spec
from conveyor.limits.base import (
    RATE_SLACK,
    Decision,
    Limiter,
    Override,
    Parcel,
    Usage,
    gcra,
)
from conveyor.locations import path_from_url, redact
from conveyor.pgfailover import with_failover_defaults

Q = sqlfiles.load("conveyor.limits", "sql/limits.sql")
_PARAM = re.compile(r":(\w+)")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

T = TypeVar("T")


class Tx(Protocol):
    """One open transaction: run a named query, get its rows."""

    def rows(self, name: str, **params: Any) -> list[Any]: ...


class SqlLimiter(Limiter):
    """The algorithm, over a `_transaction` each store supplies."""

    dialect = ""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """One transaction holding the store's write lock."""

    def _do(self, fn: Callable[[Tx], T]) -> T:
        with self._transaction() as tx:
            return fn(tx)

    # -- the seam -----------------------------------------------------------------------

    def admit(self, parcel: Parcel, specs: Sequence[Spec], now: float, lease: float, *,
              rate_reserved: bool = False) -> Decision:
        return self._do(lambda tx: self._admit(tx, parcel, specs, now, lease, rate_reserved))

    def _admit(self, tx: Tx, parcel: Parcel, specs: Sequence[Spec], now: float, lease: float,
               reserved: bool) -> Decision:
        rows = {s.key: tx.rows("declare", key=s.key, declared=json.dumps(s.wire()))[0]
                for s in specs}
        full = self._full(tx, parcel.id, specs, rows, now)
        if full is not None:
            self._park(tx, parcel, full)
            return Decision("parked", full.key)
        if not reserved:
            delay = self._reserve_rates(tx, specs, rows, now)
            if delay > RATE_SLACK:
                return Decision("delayed", delay=delay)
        for s in specs:
            if s.kind == "c":
                tx.rows("grant", key=s.key, holder=parcel.id, weight=s.weight,
                        expires=now + lease)
        tx.rows("unpark_drop", id=parcel.id)
        return Decision("run")

    def park_many(self, items: Sequence[tuple[Parcel, Sequence[Spec]]],
                  now: float) -> list[str]:
        return self._do(lambda tx: self._park_many(tx, items, now)) if items else []

    def _park_many(self, tx: Tx, items: Sequence[tuple[Parcel, Sequence[Spec]]],
                   now: float) -> list[str]:
        distinct = {s.key: s for _, specs in items for s in specs}  # one declare per key
        rows = {key: tx.rows("declare", key=key, declared=json.dumps(s.wire()))[0]
                for key, s in distinct.items()}
        out = []
        for parcel, specs in items:
            full = self._full(tx, parcel.id, specs, rows, now)
            if full is not None:
                self._park(tx, parcel, full)
            out.append(full.key if full is not None else "")
        return out

    def _full(self, tx: Tx, holder: str, specs: Sequence[Spec], rows: dict[str, Any],
              now: float) -> Spec | None:
        """The first concurrency key with no room for `holder` (lapsed tokens ignored:
        they are deleted by `release` and `sweep`)."""
        for s in specs:
            if s.kind != "c":
                continue
            used, holds = tx.rows("room", key=s.key, holder=holder, now=now)[0]
            limit = rows[s.key][0] if rows[s.key][0] is not None else s.max
            if not holds and used + s.weight > limit:
                return s
        return None

    def _park(self, tx: Tx, parcel: Parcel, full: Spec) -> None:
        tx.rows("drop_all", holder=parcel.id)  # parked, it holds nothing anywhere
        tx.rows(f"park_{self.dialect}", id=parcel.id, key=full.key, queue=parcel.queue,
                body=parcel.body, priority=parcel.priority, weight=full.weight)
        tx.rows("deny", key=full.key)

    def _reserve_rates(self, tx: Tx, specs: Sequence[Spec], rows: dict[str, Any],
                       now: float) -> float:
        delay = 0.0
        for s in specs:
            if s.kind != "r":
                continue
            _, per_second, burst, tat = rows[s.key]
            start, new_tat = gcra(tat, now, per_second or s.per_second, burst or s.burst)
            tx.rows("set_tat", key=s.key, tat=new_tat)
            if start - now > RATE_SLACK:
                tx.rows("deny", key=s.key)
            delay = max(delay, start - now)
        return delay

    def release(self, holder: str, specs: Sequence[Spec], now: float,
                lease: float) -> list[Parcel]:
        keys = [s.key for s in specs if s.kind == "c"]
        if not keys:
            return []

        def run(tx: Tx) -> list[Parcel]:
            out: list[Parcel] = []
            for key in keys:
                tx.rows("drop", key=key, holder=holder)
                tx.rows("purge", key=key, now=now)
                out += self._unpark(tx, key, now, lease)
                tx.rows("forget_idle", key=key, now=now)
            return out
        return self._do(run)

    def _unpark(self, tx: Tx, key: str, now: float, lease: float) -> list[Parcel]:
        found = tx.rows("key_row", key=key)
        if not found:
            return []
        declared, override = json.loads(found[0][0]), found[0][1]
        limit = override if override is not None else int(declared.get("max", 1))
        free = limit - int(tx.rows("used", key=key)[0][0])
        out = []
        for pid, queue, body, priority, weight in tx.rows("oldest_parked", key=key,
                                                           limit=max(free, 0)):
            if weight > free:
                break
            free -= weight
            tx.rows("grant", key=key, holder=pid, weight=weight, expires=now + lease)
            tx.rows("mark_moving", id=pid, until=now + lease)
            out.append(Parcel(pid, queue, bytes(body), priority))
        return out

    def renew(self, held: Sequence[tuple[str, Sequence[Spec]]], now: float,
              lease: float) -> None:
        pairs = [(s.key, holder) for holder, specs in held for s in specs if s.kind == "c"]
        if not pairs:
            return

        def run(tx: Tx) -> None:
            for key, holder in pairs:
                tx.rows("renew", key=key, holder=holder, expires=now + lease)
        self._do(run)

    def sweep(self, now: float, lease: float) -> list[Parcel]:
        def run(tx: Tx) -> list[Parcel]:
            out: list[Parcel] = []
            for key, *_ in tx.rows("keys"):
                tx.rows("purge", key=key, now=now)
                out += self._unpark(tx, key, now, lease)
                tx.rows("forget_idle", key=key, now=now)
            tx.rows("forget_lapsed_unique", now=now)
            for pid, queue, body, priority, key in tx.rows("stale_moving", now=now):
                tx.rows("mark_moving", id=pid, until=now + lease)
                tx.rows("renew", key=key, holder=pid, expires=now + lease)
                out.append(Parcel(pid, queue, bytes(body), priority))
            return out
        return self._do(run)

    def moved(self, ids: Sequence[str]) -> None:
        if not ids:
            return

        def run(tx: Tx) -> None:
            for pid in ids:
                tx.rows("moved", id=pid)
        self._do(run)

    def hold(self, key: str, holder: str, now: float, ttl: float) -> str:
        return str(self._do(lambda tx: _hold(tx, key, holder, now, ttl)))

    def unhold(self, key: str, holder: str) -> None:
        self._do(lambda tx: tx.rows("unhold", key=key, holder=holder))

    def cancel(self, message_id: str, now: float, ttl: float) -> bool:
        return bool(self._do(lambda tx: _cancel(tx, message_id, now, ttl)))

    def cancels(self, now: float, since: float = 0.0) -> list[str]:
        return [str(r[0]) for r in self._do(lambda tx: tx.rows("cancels", now=now,
                                                                 since=since))]

    # -- operators ------------------------------------------------------------------------

    def set_limit(self, key: str, override: Override) -> None:
        self._do(lambda tx: tx.rows("set_limit", key=key, max=override.max,
                                    per_second=override.per_second, burst=override.burst))

    def clear(self, key: str) -> bool:
        def run(tx: Tx) -> bool:
            had = tx.rows("key_row", key=key)
            tx.rows("clear", key=key)
            return bool(had) and any(v is not None for v in had[0][1:])
        return bool(self._do(run))

    def usage(self, now: float) -> list[Usage]:
        def run(tx: Tx) -> list[Usage]:
            out = []
            for key, declared, mx, per_second, burst, denied in tx.rows("keys"):
                d = json.loads(declared)
                live = tx.rows("live_tokens", key=key, now=now)
                out.append(Usage(
                    key, sum(int(weight) for _, weight in live),
                    int(tx.rows("waiting", key=key)[0][0]), int(denied),
                    holders=tuple(str(holder) for holder, _ in live),
                    max=mx if mx is not None else d.get("max"),
                    per_second=per_second if per_second is not None else d.get("ps"),
                    burst=burst if burst is not None else d.get("b"),
                    overridden=any(v is not None for v in (mx, per_second, burst))))
            return out
        return self._do(run)


def _hold(tx: Tx, key: str, holder: str, now: float, ttl: float) -> str:
    """`Limiter.hold` in one transaction: take the key, else read who has it. The read
    cannot miss: the conflicting row stays locked by the insert (Postgres: ON CONFLICT DO
    UPDATE locks it even when its WHERE declines the update) or by the write lock (SQLite)."""
    taken = tx.rows("hold", key=key, holder=holder, expires=now + ttl, now=now)
    if taken:
        return str(taken[0][0])
    return str(tx.rows("holder", key=key, now=now)[0][0])


def _cancel(tx: Tx, message_id: str, now: float, ttl: float) -> bool:
    """`Limiter.cancel` in one transaction: lapsed records go first (by their index)."""
    tx.rows("forget_lapsed_cancels", now=now)
    return bool(tx.rows("cancel", id=message_id, now=now, expires=now + ttl))


# -- SQLite -----------------------------------------------------------------------------------

class _SqliteTx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def rows(self, name: str, **params: Any) -> list[Any]:
        return self.db.execute(Q[name], params).fetchall()


class SQLiteLimiter(SqlLimiter):
    """Limits in the SQLite file of the broker (or any SQLite file)."""

    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        path, _ = path_from_url(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, timeout=30,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(Q["schema_sqlite"])

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield _SqliteTx(self._db)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()


# -- Postgres ---------------------------------------------------------------------------------

class _PostgresTx:
    def __init__(self, cur: Any) -> None:
        self.cur = cur

    def rows(self, name: str, **params: Any) -> list[Any]:
        self.cur.execute(_PARAM.sub(r"%(\1)s", Q[name]), params)
        return list(self.cur.fetchall()) if self.cur.description else []


def parse_postgres_url(url: str) -> tuple[dict[str, Any], str, bool]:
    """(psycopg connect arguments, schema, commit asynchronously) from
    `postgresql://…?schema=x&commit=async`."""
    from psycopg.conninfo import conninfo_to_dict
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = dict(query).get("schema", "conveyor")
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(f"limits URL {redact(url)!r}: schema {schema!r} is not allowed; use "
                          "lowercase letters, digits and _")
    commit = dict(query).get("commit", "sync")
    if commit not in ("sync", "async"):
        raise ConfigError(f"limits URL {redact(url)!r}: commit={commit!r} must be sync or async")
    ours = ("schema", "ack_commit", "retry_seconds", "reconnect_timeout", "commit")
    rest = [(k, v) for k, v in query if k not in ours]
    params = conninfo_to_dict(urlunsplit(parts._replace(query=urlencode(rest))))
    params["options"] = f"{params.get('options', '')} -c search_path={schema}".strip()
    return with_failover_defaults(params), schema, commit == "async"


def _connect(params: dict[str, Any], url: str) -> Any:
    """The limits store's session; a refusal or an outage is one line naming the URL."""
    import psycopg
    try:
        return psycopg.connect(**{"connect_timeout": "10", **params}, autocommit=True)
    except psycopg.OperationalError as exc:
        raise refusals.failed_contact(f"the limits store: Postgres at {redact(url)}", exc,
                                      refusals.postgres(exc)) from None


class PostgresLimiter(SqlLimiter):
    """Limits in tables beside the broker's (or the state store's), in one schema.

    `commit=async` (what `locations.store_urls` asks for when the limits share the Postgres broker's
    database and its acks commit asynchronously): a park's commit does not wait for the WAL
    flush. That is safe for the same reason the broker's async ack is: the WAL is written in
    order, so the broker's ack of a parked message, committed after the park, cannot survive
    a crash that the park did not. With limits in another database, commits are synchronous.
    """

    dialect = "postgres"

    def __init__(self, url: str) -> None:
        from psycopg import sql
        self._params, self.schema, self._async_commit = parse_postgres_url(url)
        self._url = url
        self._db = self._open()
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                               (f"conveyor-limits-ddl:{self.schema}",))
            self._conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self.schema)))
            self._conn.execute(Q["schema_postgres"])
            self._conn.execute(Q["admit_function_postgres"])
            self._conn.execute(Q["release_function_postgres"])
            self._conn.execute(Q["park_function_postgres"])

    def _open(self) -> Any:
        conn = _connect(self._params, self._url)
        if self._async_commit:
            conn.execute("SET synchronous_commit = off")
        return conn

    @property
    def _conn(self) -> Any:
        """The session; a lost one (its server died, or failed over to a standby: the URL
        may name several hosts, pgfailover.py) is opened again here, on the primary of the
        moment. The call that found it lost failed: its caller decides what to do again."""
        if self._db.closed or self._db.broken:
            self._db = self._open()
        return self._db

    def admit(self, parcel: Parcel, specs: Sequence[Spec], now: float, lease: float, *,
              rate_reserved: bool = False) -> Decision:
        """One round trip: the steps of `SqlLimiter._admit` in a server-side function."""
        row = self._conn.execute(
            "SELECT verdict, full_key, delay FROM conveyor_limit_admit(%s::jsonb, %s, %s, %s,"
            " %s, %s, %s, %s, %s)",
            (json.dumps([s.wire() for s in specs]), parcel.id, parcel.queue, parcel.body,
             parcel.priority, now, lease, rate_reserved, RATE_SLACK)).fetchone()
        assert row is not None
        return Decision(row[0], row[1], float(row[2]))

    def park_many(self, items: Sequence[tuple[Parcel, Sequence[Spec]]],
                  now: float) -> list[str]:
        """One round trip: `SqlLimiter._park_many` in a server-side function."""
        if not items:
            return []
        rows = self._conn.execute(
            "SELECT r_key FROM conveyor_limit_park_many(%s::jsonb[], %s::text[], %s::text[],"
            " %s::bytea[], %s::integer[], %s)",
            ([json.dumps([s.wire() for s in specs]) for _, specs in items],
             [p.id for p, _ in items], [p.queue for p, _ in items],
             [p.body for p, _ in items], [p.priority for p, _ in items], now)).fetchall()
        return [r[0] for r in rows]

    def release(self, holder: str, specs: Sequence[Spec], now: float,
                lease: float) -> list[Parcel]:
        """One round trip: `SqlLimiter.release` in a server-side function."""
        keys = [s.key for s in specs if s.kind == "c"]
        if not keys:
            return []
        rows = self._conn.execute(
            "SELECT r_id, r_queue, r_body, r_priority FROM conveyor_limit_release(%s, %s::text[],"
            " %s, %s)", (holder, keys, now, lease)).fetchall()
        return [Parcel(r[0], r[1], bytes(r[2]), r[3]) for r in rows]

    def hold(self, key: str, holder: str, now: float, ttl: float) -> str:
        """Without the limiter's advisory lock: the key's row lock orders racing holds, so
        producers do not queue behind the workers' admissions (nor each other's keys)."""
        with self._conn.transaction(), self._conn.cursor() as cur:
            return _hold(_PostgresTx(cur), key, holder, now, ttl)

    def unhold(self, key: str, holder: str) -> None:
        """One conditional DELETE: atomic by itself, no advisory lock."""
        with self._conn.cursor() as cur:
            _PostgresTx(cur).rows("unhold", key=key, holder=holder)

    def cancel(self, message_id: str, now: float, ttl: float) -> bool:
        """Without the limiter's advisory lock, as `hold`: the id's row orders racing
        cancels, and nothing else reads it under that lock."""
        with self._conn.transaction(), self._conn.cursor() as cur:
            return _cancel(_PostgresTx(cur), message_id, now, ttl)

    def cancels(self, now: float, since: float = 0.0) -> list[str]:
        with self._conn.cursor() as cur:
            return [str(r[0]) for r in _PostgresTx(cur).rows("cancels", now=now, since=since)]

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._conn.transaction(), self._conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                        (f"conveyor-limits:{self.schema}",))
            yield _PostgresTx(cur)

    def close(self) -> None:
        self._db.close()
