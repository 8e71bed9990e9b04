"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor.state.store import Store, from_url


@pytest.fixture
def store(state_url: str) -> Iterator[Store]:
    """A state store on each database: an SQLite file, and a Postgres schema of its own
    (`state_url` from tests/conftest.py)."""
    opened = from_url(state_url)
    yield opened
    opened.close()
