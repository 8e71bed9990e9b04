"""The conformance suite runs every test once per transport, against the real servers."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.broker import Broker, from_url
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, REDIS_URL, clean_transport, require_service

# transport -> (service it needs or None, URL for a test given its temp dir and unique name)
TRANSPORTS: dict[str, tuple[str | None, Callable[[Path, str], str]]] = {
    "sqlite": (None, lambda tmp, name: f"sqlite:///{tmp}/broker.db"),
    "redis": ("redis", lambda tmp, name: f"{REDIS_URL}?prefix={name}"),
    "postgres": ("postgres", lambda tmp, name: f"{POSTGRES_URL}?schema={name}"),
    "rabbitmq": ("rabbitmq", lambda tmp, name: RABBITMQ_URL),
}
# Transports that pass the suite; a transport joins this list when it is done.
ENABLED = ["sqlite", "redis", "postgres", "rabbitmq"]


@pytest.fixture(params=ENABLED)
def transport(request: pytest.FixtureRequest) -> str:
    service = TRANSPORTS[request.param][0]
    if service:
        require_service(service)
    return str(request.param)


@pytest.fixture(autouse=True)
def _clean_shared_server(request: pytest.FixtureRequest, unique: str) -> Iterator[None]:
    """After a test, remove what it left on a shared server under its unique name."""
    yield
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None:
        clean_transport(str(callspec.params.get("transport")), unique)


@pytest.fixture
def broker_url(transport: str, tmp_path: Path, unique: str) -> str:
    return TRANSPORTS[transport][1](tmp_path, unique)


@pytest.fixture
def make_broker(broker_url: str) -> Iterator[Callable[..., Broker]]:
    """Open brokers on the test's URL; all are closed when the test ends."""
    opened: list[Broker] = []

    def make(**options: object) -> Broker:
        broker = from_url(broker_url, **options)
        opened.append(broker)
        return broker

    yield make
    for broker in opened:
        broker.close()


@pytest.fixture
def queue(unique: str) -> str:
    return f"q-{unique}"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes a test starts; killed by pid when it ends, so none outlives it."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def unique_name() -> str:
    return "t" + uuid.uuid4().hex[:12]


CONSUMER = str(Path(__file__).with_name("consumer_proc.py"))
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
