"""The state store on each database: what the two dialect files must do alike.

The unit tests run the store on SQLite only; these run on SQLite and on Postgres. Every
named query is compiled against the migrated schema (a column or function one dialect lacks
fails here, not in the one scheduler that runs the query), and a transaction's batch insert
is all or nothing on both.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import psycopg
import pytest

from conveyor import sqlfiles
from conveyor.state.store import PostgresStore, SQLiteStore, Store
from tests.conftest import POSTGRES_URL

#: psycopg's `%(name)s`; a parameter next to + or - is a number (Postgres cannot tell).
POSTGRES_PARAM = re.compile(r"%\((\w+)\)s")
ARITHMETIC = re.compile(r"\$(\d+)\s*[-+]|[-+]\s*\$(\d+)")
FLOAT8 = 701


def queries(dialect: str) -> dict[str, str]:
    """The store's named queries, less the migrations (scripts the store runs at start)."""
    return {name: sql for name, sql in sqlfiles.load("conveyor.state", f"sql/{dialect}.sql")
            .items() if not name.startswith("migration_")}


def numbered(sql: str) -> tuple[str, int]:
    """`%(name)s` as `$n` (one number per name), and how many there are."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return POSTGRES_PARAM.sub(number, sql).replace("%%", "%"), len(names)


def postgres_errors(schema: str, named: dict[str, str]) -> dict[str, str]:
    """Each query Postgres refuses to prepare in `schema`, with its reason."""
    errors = {}
    with psycopg.connect(POSTGRES_URL, options=f"-c search_path={schema}") as conn:
        for name, sql in named.items():
            text, count = numbered(sql)
            numbers = {int(n) for pair in ARITHMETIC.findall(text) for n in pair if n}
            types = [FLOAT8 if n in numbers else 0 for n in range(1, count + 1)]
            result = conn.pgconn.prepare(f"check_{name}".encode(), text.encode(), types)
            if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
                errors[name] = (result.error_message or b"").decode().strip()
    return errors


def sqlite_errors(path: Path, named: dict[str, str]) -> dict[str, str]:
    """Each query SQLite refuses to compile (EXPLAIN compiles without running it)."""
    errors = {}
    with sqlite3.connect(path) as conn:
        for name, sql in named.items():
            try:
                conn.execute(f"EXPLAIN {sql}", dict.fromkeys(re.findall(r":(\w+)", sql)))
            except sqlite3.Error as exc:
                errors[name] = str(exc)
    return errors


def compile_errors(store: Store, named: dict[str, str] | None = None) -> dict[str, str]:
    """The store's queries (or `named`) that do not compile against its schema."""
    if isinstance(store, PostgresStore):
        return postgres_errors(store.schema, queries("postgres") if named is None else named)
    assert isinstance(store, SQLiteStore)
    return sqlite_errors(store.path, queries("sqlite") if named is None else named)


def test_every_named_query_compiles_against_the_migrated_schema(store: Store) -> None:
    assert compile_errors(store) == {}


def test_a_query_on_a_column_no_migration_made_is_reported_by_name(store: Store) -> None:
    errors = compile_errors(store, {"broken": "SELECT no_such_column FROM conveyor_runs"})
    assert list(errors) == ["broken"] and "no_such_column" in errors["broken"]


def test_exec_many_inside_a_failed_transaction_leaves_nothing(store: Store) -> None:
    """A run's rows go in with exec_many (one round trip on Postgres): all or none."""
    rows = [{"run_id": "r1", "upstream": f"a{i}", "downstream": "b"} for i in range(3)]
    with pytest.raises(RuntimeError), store.transaction():
        store.exec("insert_run", run_id="r1", dag_id="d", logical_date=1.0, run_type="manual",
                   conf="{}", dag_version="v", now=1.0)
        store.exec_many("insert_edge", rows)
        raise RuntimeError("stop before the commit")
    assert store.rows("run_edges", run_id="r1") == []
    with store.transaction():
        store.exec("insert_run", run_id="r1", dag_id="d", logical_date=1.0, run_type="manual",
                   conf="{}", dag_version="v", now=1.0)
        store.exec_many("insert_edge", rows)
        store.exec_many("insert_edge", [])
    assert len(store.rows("run_edges", run_id="r1")) == 3
