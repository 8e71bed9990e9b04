"""What keeps the unit tests free of services: Redis, Postgres and RabbitMQ are for
tests/contract, tests/integration and tests/e2e.

A unit test fails at setup when a fixture it uses, however indirectly, names a service (its
URL, `require_service`, a cleanup on a server), and test_no_services.py fails when a unit
module itself names one. Both read source, so a fixture that would reach a server is caught
before it tries (a test that does reach one would hang or fail only where none runs).
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: What tests/conftest.py offers for reaching or cleaning up the shared servers.
SERVICE_NAMES = frozenset({
    "POSTGRES_URL", "REDIS_URL", "RABBITMQ_URL", "RABBITMQ_MANAGEMENT", "require_service",
    "drop_postgres_schema", "delete_redis_prefix", "delete_rabbitmq_queues",
    "rabbitmq_management", "clean_transport", "opened_brokers",
})


def names_in(source: str) -> set[str]:
    """The service names a piece of source uses or imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.name.rsplit(".", 1)[-1])
    return found & SERVICE_NAMES


@functools.cache
def _names_in_function(func: Callable[..., Any]) -> frozenset[str]:
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return frozenset()  # pytest's own fixtures (tmp_path, caplog…): no source to read
    return frozenset(names_in(inspect.cleandoc("\n" + source) if source[0].isspace()
                              else source))


def service_fixtures(name2fixturedefs: Mapping[str, Sequence[Any]]) -> dict[str, list[str]]:
    """Each fixture of a test's closure (the definition it gets: the last, the nearest) whose
    code names a service, with the names."""
    return {name: sorted(found) for name, defs in name2fixturedefs.items()
            if defs and (found := _names_in_function(defs[-1].func))}
