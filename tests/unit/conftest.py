"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conveyor.state.store import Store, from_url
from tests.conftest import POSTGRES_URL, require_service


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[Store]:
    """A state store on each database: an SQLite file, and a Postgres schema of its own."""
    if request.param == "sqlite":
        opened = from_url(f"sqlite:///{tmp_path}/state.db")
        yield opened
        opened.close()
        return
    require_service("postgres")
    opened = from_url(f"{POSTGRES_URL}?schema={unique}")
    yield opened
    opened.close()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(unique)))
