"""Unit means no service: these fail when a unit test reaches for Redis, Postgres or RabbitMQ
(see service_guard.py; the fixtures are checked at each unit test's setup, in conftest.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import tests.conftest as root
import tests.unit.conftest as unit
from tests.unit.service_guard import SERVICE_NAMES, names_in, service_fixtures

UNIT = Path(__file__).parent
#: The guard itself names them, to look for them.
GUARDS = {"service_guard.py", "test_no_services.py"}


def test_no_unit_module_names_a_service() -> None:
    named = {path.name: sorted(found) for path in sorted(UNIT.glob("*.py"))
             if path.name not in GUARDS and (found := names_in(path.read_text()))}
    assert named == {}, "unit tests use no service: move these to tests/contract or " \
                        "tests/integration, or use SQLite"


def test_a_module_that_imports_a_service_url_is_found() -> None:
    assert names_in("from tests.conftest import POSTGRES_URL as url\n") == {"POSTGRES_URL"}
    assert names_in("import tests.conftest as c\nc.require_service('redis')\n") == {
        "require_service"}
    assert names_in("url = 'sqlite:///x.db'\n") == set()


def definitions(*funcs: object) -> list[SimpleNamespace]:
    return [SimpleNamespace(func=f) for f in funcs]


def test_a_fixture_that_needs_a_service_is_found_and_the_nearest_definition_decides() -> None:
    root_state_url = root.state_url.__wrapped__  # type: ignore[attr-defined]
    unit_state_url = unit.state_url.__wrapped__  # type: ignore[attr-defined]
    assert service_fixtures({"state_url": definitions(root_state_url)}) == {
        "state_url": ["POSTGRES_URL", "drop_postgres_schema", "require_service"]}
    assert service_fixtures({"state_url": definitions(root_state_url, unit_state_url)}) == {}
    assert service_fixtures({"tmp_path": definitions(print)}) == {}


def test_the_names_looked_for_are_what_tests_conftest_offers() -> None:
    assert all(hasattr(root, name) for name in SERVICE_NAMES)


@pytest.mark.parametrize("name", ["state_url", "store"])
def test_the_unit_state_store_is_an_sqlite_file(name: str, request: pytest.FixtureRequest
                                                 ) -> None:
    value = request.getfixturevalue(name)
    assert (value if name == "state_url" else value.dialect).startswith("sqlite")
