"""The state store: runs, task instances, edges and attempts, in SQLite or Postgres.

It is the scheduler's only source of truth. The SQL lives in `sql/sqlite.sql` and
`sql/postgres.sql` (one named query set per database, the same names and parameters: a test
compares them); this module only connects, applies the migrations on start, runs named
queries and brackets transactions. The repositories (`runs.py`, `tasks.py`,
`monitoring.py`) name the queries and return records (`records.py`); every other module calls
them, so what each transition does is read in SQL, once per database, and used through
typed methods.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from conveyor import refusals, sqlfiles
from conveyor.errors import (
    BrokerConnectionError,
    ConfigError,
    Refused,
    StateStoreLost,
    StateStoreUnavailable,
    one_line,
)
from conveyor.locations import embedded_state_url, path_from_url, redact, scheme
from conveyor.pgfailover import is_connection_loss, url_names_several_hosts

Row = dict[str, Any]
T = TypeVar("T")
_log = logging.getLogger("conveyor.state")


class Store:
    """Named queries over one database connection. Not thread-safe: one per thread."""

    dialect = ""

    def __init__(self) -> None:
        self.queries = sqlfiles.load("conveyor.state", f"sql/{self.dialect}.sql")
        self._depth = 0

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All statements inside commit together or not at all (re-entrant: joins an outer)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._begin()
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self._rollback()
            raise
        self._depth = 0
        self._commit()

    def rows(self, query: str, **params: Any) -> list[Row]:
        return self._run(query, params)[0]

    def one(self, query: str, **params: Any) -> Row | None:
        found = self.rows(query, **params)
        return found[0] if found else None

    def exec(self, query: str, **params: Any) -> int:
        """Run a statement; return how many rows it changed."""
        return self._run(query, params)[1]

    def exec_many(self, query: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement once per row of parameters, in one round trip where the database
        is remote (Postgres pipelines them): a run's 100 task instances, not 100 trips."""
        if rows:
            self._execute_many(self.queries[query], rows)

    def migrate(self) -> None:
        """Bring the schema up to date; safe when several schedulers start at once."""
        with self.transaction():
            self.exec("lock_schema")
            self._prepare_schema()
            self._script(self.queries["schema_table"])
            current = int((self.one("schema_version") or {"version": 0})["version"])
            for name in sorted(q for q in self.queries if q.startswith("migration_")):
                version = int(name.rsplit("_", 1)[1])
                if version > current:
                    self._script(self.queries[name])
                    self.exec("set_schema_version", version=version)

    def _script(self, text: str) -> None:
        for statement in text.split(";\n"):
            if statement.strip(" \n;"):
                self._execute(statement, {})

    def _prepare_schema(self) -> None:
        """Hook: create what the dialect needs before the tables (a Postgres schema)."""

    def _run(self, query: str, params: dict[str, Any]) -> tuple[list[Row], int]:
        return self._execute(self.queries[query], params)

    # -- per database ---------------------------------------------------------------------

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[Row], int]:
        raise NotImplementedError

    def _execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        raise NotImplementedError

    def _begin(self) -> None:
        raise NotImplementedError

    def _commit(self) -> None:
        raise NotImplementedError

    def _rollback(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SQLiteStore(Store):
    """WAL mode; a transaction is `BEGIN IMMEDIATE`, so writers queue instead of deadlocking."""

    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.path, options = path_from_url(url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30,
                                   check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={options.get('synchronous', 'NORMAL')}")
        self._db.execute("PRAGMA foreign_keys=ON")

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[Row], int]:
        cursor = self._db.execute(sql, params)
        found = [dict(row) for row in cursor.fetchall()]
        return found, cursor.rowcount

    def _execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self._db.executemany(sql, rows)

    def _begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self._db.execute("COMMIT")

    def _rollback(self) -> None:
        self._db.execute("ROLLBACK")

    def close(self) -> None:
        self._db.close()


class PostgresStore(Store):
    """psycopg 3 in autocommit mode with explicit transactions; `?schema=NAME` in the URL
    keeps the tables in their own schema (created on start).

    Failover: a URL may name a primary and its standbys (`postgresql://h1:5432,h2:5433/db`,
    pgfailover.py). A session lost in use (the server died, or it answers as a standby)
    raises `StateStoreLost` and is closed; the next use outside a transaction opens a new one
    on whichever host is the primary then, trying with backoff for up to `?retry_seconds=`
    (default 60), and LISTENs again on its channels."""

    dialect = "postgres"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = redact(url)
        self._conninfo, self.schema, retry = _split_schema(url)
        self._transaction: Any = None
        self._listening: set[str] = set()
        self._db = self._connect()
        from conveyor.broker.reconnect import Reconnect
        self._reconnect = Reconnect(f"the state store at {self.url}", _log, is_connection_loss,
                                    retry)
        self._reconnect.reached = True

    def _connect(self) -> Any:
        """The first session; a refusal or an outage is one line naming the URL."""
        import psycopg
        try:
            return self._open()
        except psycopg.OperationalError as exc:
            reason = refusals.postgres(exc)   # a database that does not exist: not an outage
            if reason:
                raise Refused(f"the state store: Postgres at {self.url} {reason}") from None
            detail = " ".join(str(exc).split())   # one line: psycopg's message has two
            raise StateStoreUnavailable(
                f"cannot reach the state store {self.url}: {detail}; check that it is "
                "running, and the host and port in the URL") from None

    def _open(self) -> Any:
        """A new session, with the schema as its search_path, LISTENing where we did."""
        import psycopg
        from psycopg.rows import dict_row
        db = psycopg.connect(self._conninfo, autocommit=True, row_factory=dict_row)
        try:
            if self.schema:
                db.execute(f"SET search_path TO {_quoted(self.schema)}")
            for channel in sorted(self._listening):
                db.execute(f"LISTEN {_quoted(channel)}")
        except BaseException:
            db.close()
            raise
        return db

    def _script(self, text: str) -> None:
        """A migration in one round trip: psycopg sends a statement without parameters as a
        simple query, which may hold several. One statement a round trip, a fresh schema
        took ~80 of them: 19 s over a link with 200 ms round trips, on a worker's main loop
        (its first result opens the result store), with no lease renewed meanwhile."""
        if text.strip(" \n;"):
            self._execute(text, {})

    def _session(self) -> Any:
        """The session, opened again first if it was lost (never inside a transaction: the
        transaction went with it, and `_guarded` said so)."""
        if self._transaction is None and (self._db.closed or self._db.broken):
            try:
                self._db = self._reconnect.call("reconnecting", self._open)
            except BrokerConnectionError as exc:   # Reconnect's words, the store's error
                raise StateStoreUnavailable(str(exc).replace(
                    "in the broker URL", "in the state store URL")) from None
            _log.info("state store %s: connected again", self.url)
        return self._db

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """A lost session (pgfailover.is_connection_loss) closed and raised as StateStoreLost."""
        import psycopg
        try:
            yield
        except psycopg.Error as exc:
            if not (is_connection_loss(exc) or self._db.closed or self._db.broken):
                raise
            self._db.close()
            raise StateStoreLost(
                f"the state store {self.url}: session lost ({one_line(exc)}); what was in "
                "progress was rolled back, or its commit's outcome is unknown; the next use "
                "connects again") from exc

    def listen(self, channel: str) -> None:
        """LISTEN on `channel` (once per session: a new session LISTENs again), for
        `notifications`."""
        if channel not in self._listening:
            with self._guarded():
                self._session().execute(f"LISTEN {_quoted(channel)}")
            self._listening.add(channel)

    def notifications(self, timeout: float) -> list[str]:
        """Payloads that arrive within `timeout`: returns at the first, or empty at timeout.
        StateStoreLost if the session is lost: what was sent meanwhile is gone, so the caller
        reads again (its next use reconnects and LISTENs again before reading)."""
        with self._guarded():
            db = self._session()
            return [n.payload for n in db.notifies(timeout=timeout, stop_after=1)]

    def _prepare_schema(self) -> None:
        if self.schema:
            self._db.execute(f"CREATE SCHEMA IF NOT EXISTS {_quoted(self.schema)}")

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[Row], int]:
        with self._guarded():
            cursor = self._session().execute(sql.encode(), params or None)
            found = cursor.fetchall() if cursor.description else []
            return found, cursor.rowcount

    def _execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        with self._guarded(), self._session().cursor() as cursor:
            cursor.executemany(sql.encode(), rows)

    def _begin(self) -> None:
        with self._guarded():
            transaction = self._session().transaction()
            transaction.__enter__()
        self._transaction = transaction

    def _commit(self) -> None:
        transaction, self._transaction = self._transaction, None
        with self._guarded():
            transaction.__exit__(None, None, None)

    def _rollback(self) -> None:
        """Roll back; on a session already lost there is nothing to roll back (the caller's
        error, StateStoreLost, says so)."""
        import psycopg
        transaction, self._transaction = self._transaction, None
        try:
            transaction.__exit__(RuntimeError, RuntimeError("rolled back"), None)
        except psycopg.Error as exc:
            if not (is_connection_loss(exc) or self._db.closed or self._db.broken):
                raise
            self._db.close()

    def close(self) -> None:
        self._db.close()


#: Seconds a connect attempt waits for a server that accepts and never answers (unless the
#: URL says `?connect_timeout=`).
CONNECT_TIMEOUT = "10"
#: How long a lost session is tried again before the store says it is unavailable (unless
#: the URL says `?retry_seconds=`): long enough for a standby to be promoted.
RETRY_SECONDS = 60.0


def _split_schema(url: str) -> tuple[str, str, float]:
    """`postgresql://…?schema=x&sslmode=y` -> (`postgresql://…?sslmode=y&connect_timeout=10`,
    "x", retry seconds); several hosts connect to the one that takes writes
    (pgfailover.with_failover_defaults)."""
    from conveyor.broker.reconnect import retry_seconds
    parts = urlsplit(url)
    options = parse_qsl(parts.query)
    ours = ("schema", "retry_seconds", "reconnect_timeout")
    schema = next((v for k, v in options if k == "schema"), "")
    retry = retry_seconds({k: v for k, v in options if k in ours}, redact(url), RETRY_SECONDS)
    if not any(k == "connect_timeout" for k, _ in options):   # libpq's default: forever
        options.append(("connect_timeout", CONNECT_TIMEOUT))
    if url_names_several_hosts(url) and not any(k == "target_session_attrs"
                                                 for k, _ in options):
        options.append(("target_session_attrs", "read-write"))
    rest = urlencode([(k, v) for k, v in options if k not in ours], quote_via=quote)
    return urlunsplit(parts._replace(query=rest)), schema, retry


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def through_losses(what: str, step: Callable[[], T],
                   stop: threading.Event | None = None) -> T:
    """`step()`, run again after each loss of the Postgres store's session in it (a failover:
    the store opens a session on the new primary at the next use, or raises
    StateStoreUnavailable when none answers within its retry_seconds). For steps that are
    idempotent: what they committed before the loss changes nothing the second time. A store
    that answers and drops the session again at once is not retried in a tight loop."""
    from conveyor.broker.reconnect import BACKOFF_CAP
    losses = 0
    while True:
        try:
            return step()
        except StateStoreLost as exc:
            losses += 1
            if stop is not None and stop.is_set():
                raise
            _log.warning("%s: %s; doing it again (loss %d)", what, exc, losses)
            (stop or threading.Event()).wait(min(BACKOFF_CAP, 0.05 * 2 ** losses))


class Repository:
    """Typed methods over one store's named queries (see `state/runs.py`, `state/tasks.py`,
    `state/monitoring.py`): the only callers of `Store.rows/one/exec`, so no module above
    `state/` names a query or reads a row as a dict. Cheap to make: one per use is fine."""

    def __init__(self, store: Store) -> None:
        self.store = store


def from_url(url: str | None = None) -> Store:
    """The store for `url` (`sqlite:///…`, `postgresql://…`), migrated and ready."""
    url = url or embedded_state_url()
    kinds: dict[str, Callable[[str], Store]] = {
        "sqlite": SQLiteStore, "postgresql": PostgresStore, "postgres": PostgresStore}
    if scheme(url) not in kinds:
        raise ConfigError(f"state store URL {redact(url)!r} has an unknown scheme "
                          f"{scheme(url)!r}: "
                          "use sqlite:///path/to/scheduler.db or postgresql://user@host/db")
    store = kinds[scheme(url)](url)
    store.migrate()
    return store
