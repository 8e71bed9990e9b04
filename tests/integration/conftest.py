"""Fixtures the integration tests share: a broker URL on each transport, and broker servers
of a test's own to stop and start (private_servers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.conftest import ENABLED
from tests.integration.private_servers import (  # noqa: F401 (fixtures offered here)
    private_postgres,
    private_rabbitmq,
    private_redis,
)
from tests.integration.workerkit import transport_url


@pytest.fixture(params=ENABLED)
def any_broker_url(request: pytest.FixtureRequest, tmp_path: Path,
                   unique: str) -> Iterator[str]:
    """A broker URL on each transport, holding the test's unique name (cleaned after)."""
    with transport_url(request.param, tmp_path, unique) as url:
        yield url
