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

import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor import refusals, sqlfiles
from conveyor.errors import ConfigError, Refused, StateStoreUnavailable
from conveyor.locations import embedded_state_url, path_from_url, redact, scheme

Row = dict[str, Any]


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
    keeps the tables in their own schema (created on start)."""

    dialect = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg
        from psycopg.rows import dict_row

        super().__init__()
        conninfo, self.schema = _split_schema(url)
        try:
            self._db = psycopg.connect(conninfo, autocommit=True, row_factory=dict_row)
        except psycopg.OperationalError as exc:
            reason = refusals.postgres(exc)   # a database that does not exist: not an outage
            if reason:
                raise Refused(f"the state store: Postgres at {redact(url)} {reason}") from None
            detail = " ".join(str(exc).split())   # one line: psycopg's message has two
            raise StateStoreUnavailable(
                f"cannot reach the state store {redact(url)}: {detail}; check that it is "
                "running, and the host and port in the URL") from None
        self._transaction: Any = None
        self._listening: set[str] = set()
        if self.schema:
            self._db.execute(f"SET search_path TO {_quoted(self.schema)}")

    def listen(self, channel: str) -> None:
        """LISTEN on `channel` (once per connection), for `notifications`."""
        if channel not in self._listening:
            self._db.execute(f"LISTEN {_quoted(channel)}")
            self._listening.add(channel)

    def notifications(self, timeout: float) -> list[str]:
        """Payloads that arrive within `timeout`: returns at the first, or empty at timeout."""
        return [n.payload for n in self._db.notifies(timeout=timeout, stop_after=1)]

    def _prepare_schema(self) -> None:
        if self.schema:
            self._db.execute(f"CREATE SCHEMA IF NOT EXISTS {_quoted(self.schema)}")

    def _execute(self, sql: str, params: dict[str, Any]) -> tuple[list[Row], int]:
        cursor = self._db.execute(sql.encode(), params or None)
        found = cursor.fetchall() if cursor.description else []
        return found, cursor.rowcount

    def _execute_many(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        with self._db.cursor() as cursor:
            cursor.executemany(sql.encode(), rows)

    def _begin(self) -> None:
        self._transaction = self._db.transaction()
        self._transaction.__enter__()

    def _commit(self) -> None:
        transaction, self._transaction = self._transaction, None
        transaction.__exit__(None, None, None)

    def _rollback(self) -> None:
        transaction, self._transaction = self._transaction, None
        transaction.__exit__(RuntimeError, RuntimeError("rolled back"), None)

    def close(self) -> None:
        self._db.close()


#: Seconds a connect attempt waits for a server that accepts and never answers (unless the
#: URL says `?connect_timeout=`).
CONNECT_TIMEOUT = "10"


def _split_schema(url: str) -> tuple[str, str]:
    """`postgresql://…?schema=x&sslmode=y` -> (`postgresql://…?sslmode=y&connect_timeout=10`,
    "x")."""
    parts = urlsplit(url)
    options = parse_qsl(parts.query)
    schema = next((v for k, v in options if k == "schema"), "")
    if not any(k == "connect_timeout" for k, _ in options):   # libpq's default: forever
        options.append(("connect_timeout", CONNECT_TIMEOUT))
    rest = urlencode([(k, v) for k, v in options if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


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
