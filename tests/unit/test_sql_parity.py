"""The SQLite and Postgres query files say the same thing in two dialects.

The state store's callers name a query and pass its parameters the same way whatever the
database, so a query added to one dialect's file and not the other, or a parameter spelled
differently, only fails on the database the author did not run: these tests fail first.
The brokers' two files are not compared: they are two designs (Postgres reads the database's
clock and acks in batches, SQLite is handed `now` and acks one by one), called by two modules.
"""

from __future__ import annotations

import re

import pytest

from conveyor import sqlfiles

#: SQLite's `:name` (not `::type`, a Postgres cast) and psycopg's `%(name)s`.
SQLITE_PARAM = re.compile(r"(?<![:\w]):(\w+)")
POSTGRES_PARAM = re.compile(r"%\((\w+)\)s")
#: Parameters only one dialect takes, each with its reason: (query, parameter).
ONE_DIALECT_ONLY = {
    ("put_result", "channel"): "Postgres wakes result waiters with pg_notify in the same "
                               "statement; SQLite wakes them through a socket beside its file",
}


def params(sql: str, pattern: re.Pattern[str]) -> set[str]:
    """The parameter names a query takes, comments and string literals left out."""
    code = re.sub(r"--[^\n]*", "", sql)
    code = re.sub(r"'[^']*'", "''", code)
    return set(pattern.findall(code))


def signatures(package: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    sqlite = sqlfiles.load(package, "sql/sqlite.sql")
    postgres = sqlfiles.load(package, "sql/postgres.sql")
    return ({name: params(sql, SQLITE_PARAM) for name, sql in sqlite.items()},
            {name: params(sql, POSTGRES_PARAM) for name, sql in postgres.items()})


def differences(sqlite: dict[str, set[str]], postgres: dict[str, set[str]]) -> list[str]:
    """One line per query whose parameters differ between the two files (less the ones
    ONE_DIALECT_ONLY explains)."""
    return [f"{name}: sqlite {sorted(sqlite[name])} vs postgres {sorted(postgres[name])}"
            for name in sorted(sqlite.keys() & postgres.keys())
            if sqlite[name] ^ postgres[name] - {p for q, p in ONE_DIALECT_ONLY if q == name}]


def test_the_state_query_files_hold_the_same_names() -> None:
    sqlite, postgres = signatures("conveyor.state")
    assert sorted(sqlite.keys() - postgres.keys()) == [], "only in state/sql/sqlite.sql"
    assert sorted(postgres.keys() - sqlite.keys()) == [], "only in state/sql/postgres.sql"


def test_the_state_queries_take_the_same_parameters() -> None:
    sqlite, postgres = signatures("conveyor.state")
    assert differences(sqlite, postgres) == []
    assert sqlite["insert_run"], "the parameter patterns found nothing: they are wrong"


@pytest.mark.parametrize(("text", "expected"), [
    ("SELECT * FROM t WHERE a = :a AND b::TEXT = :b -- :c\n", {"a", "b"}),
    ("UPDATE t SET s = 'x:y' WHERE id = :id", {"id"}),
])
def test_the_sqlite_parameter_pattern_skips_casts_comments_and_literals(
        text: str, expected: set[str]) -> None:
    assert params(text, SQLITE_PARAM) == expected


def test_a_differing_parameter_is_reported_by_name() -> None:
    assert differences({"q": {"a"}}, {"q": {"b"}}) == ["q: sqlite ['a'] vs postgres ['b']"]


def test_a_parameter_only_one_dialect_needs_is_reported_unless_its_reason_is_listed() -> None:
    assert differences({"put_result": {"a"}}, {"put_result": {"a", "channel"}}) == []
    assert differences({"put_result": {"a"}}, {"put_result": {"a", "other"}}) != []
