"""Fixtures shared by the unit tests: no service, so the state store is an SQLite file.

The same tests on Postgres would create a schema each (about 50 s of the unit run) and fail
without a server; what the Postgres dialect must do the same lives in tests/contract
(test_state_store.py, test_state_records.py) and the integration tests on Postgres.
tests/unit/test_no_services.py fails when a unit test asks for a service.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.store import Store, from_url
from tests.unit.service_guard import service_fixtures

UNIT = Path(__file__).parent


@pytest.fixture
def state_url(tmp_path: Path) -> str:
    """The state store's URL: an SQLite file in the test's temp dir (this overrides
    tests/conftest.py's, which also gives a Postgres schema)."""
    return f"sqlite:///{tmp_path}/state.db"


@pytest.fixture
def store(state_url: str) -> Iterator[Store]:
    """The state store at `state_url`, migrated."""
    opened = from_url(state_url)
    yield opened
    opened.close()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a unit test before its fixtures run if one of them needs a service."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or UNIT not in item.path.parents:
        return
    needing = service_fixtures(info.name2fixturedefs)
    if needing:
        pytest.fail(f"{item.nodeid} is a unit test but its fixtures need a service: "
                    + "; ".join(f"{name} uses {', '.join(found)}"
                                for name, found in needing.items())
                    + ". Use SQLite (or an in-memory double) here, or move the test to "
                    "tests/contract or tests/integration", pytrace=False)
