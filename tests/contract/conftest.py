"""The conformance suite runs every test once per transport, against the real servers."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote
from urllib.request import Request, urlopen

import pytest

from conveyor.broker import Broker, from_url
from conveyor.broker.postgres import PostgresBroker
from conveyor.state.store import Store
from conveyor.state.store import from_url as state_from_url
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    clean_transport,
    delete_redis_prefix,
    drop_postgres_schema,
    opened_brokers,
    require_service,
)

# transport -> (service it needs or None, URL for a test given its temp dir and unique name)
TRANSPORTS: dict[str, tuple[str | None, Callable[[Path, str], str]]] = {
    "sqlite": (None, lambda tmp, name: f"sqlite:///{tmp}/broker.db"),
    "redis": ("redis", lambda tmp, name: f"{REDIS_URL}?prefix={name}"),
    "postgres": ("postgres", lambda tmp, name: f"{POSTGRES_URL}?schema={name}"),
    "rabbitmq": ("rabbitmq", lambda tmp, name: RABBITMQ_URL),
    # queue_expires: whatever a test forgets to delete, RabbitMQ drops 10 minutes later
    "kombu+redis": ("redis", lambda tmp, name: f"kombu+{REDIS_URL}?prefix={name}:"),
    "kombu+amqp": ("rabbitmq",
                   lambda tmp, name: f"kombu+{RABBITMQ_URL}?prefix={name}.&queue_expires=600"),
}
# Transports that pass the suite; a transport joins this list when it is done.
ENABLED = ["sqlite", "redis", "postgres", "rabbitmq", "kombu+redis", "kombu+amqp"]


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


@pytest.fixture(autouse=True)
def _delete_kombu_leftovers(request: pytest.FixtureRequest, unique: str) -> Iterator[None]:
    """After a kombu run of a test, delete the queues (RabbitMQ) or keys (Redis) it made."""
    yield
    callspec = getattr(request.node, "callspec", None)
    transport = callspec.params.get("transport") if callspec is not None else None
    if transport == "kombu+redis":
        delete_redis_prefix(unique)
    elif transport == "kombu+amqp":
        delete_rabbitmq_queues(unique + ".")


def delete_rabbitmq_queues(prefix: str) -> None:
    """Delete the queues named `prefix…` through RabbitMQ's management API."""
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    api = "http://127.0.0.1:15672/api/queues/%2F"
    with urlopen(Request(f"{api}?name=^{quote(prefix)}&use_regex=true",
                         headers={"Authorization": auth}), timeout=10) as reply:
        names = [q["name"] for q in json.load(reply) if q["name"].startswith(prefix)]
    for name in names:
        urlopen(Request(f"{api}/{quote(name, safe='')}", method="DELETE",
                        headers={"Authorization": auth}), timeout=10).close()


@pytest.fixture
def broker_url(transport: str, tmp_path: Path, unique: str) -> str:
    return TRANSPORTS[transport][1](tmp_path, unique)


@pytest.fixture
def make_broker(broker_url: str) -> Iterator[Callable[..., Broker]]:
    """Open brokers on the test's URL; all are closed when the test ends."""
    with opened_brokers(broker_url, from_url) as make:
        yield make


@pytest.fixture
def queue(unique: str) -> str:
    return f"q-{unique}"


def unique_name() -> str:
    return "t" + uuid.uuid4().hex[:12]


CONSUMER = str(Path(__file__).with_name("consumer_proc.py"))
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}


@pytest.fixture
def store(state_url: str) -> Iterator[Store]:
    """A state store on each database: an SQLite file, and a Postgres schema of its own
    (`state_url` from tests/conftest.py)."""
    opened = state_from_url(state_url)
    yield opened
    opened.close()


OpenPgBroker = Callable[..., PostgresBroker]


@pytest.fixture
def pg_url(unique: str) -> Iterator[str]:
    """A Postgres broker URL on a schema of the test's own, dropped after it."""
    require_service("postgres")
    yield f"{POSTGRES_URL}?schema={unique}"
    drop_postgres_schema(unique)


@pytest.fixture
def open_pg_broker(pg_url: str) -> Iterator[OpenPgBroker]:
    """`make(url=pg_url, **options)` opens a Postgres broker; all are closed at the end."""
    with opened_brokers(pg_url, PostgresBroker) as make:
        yield make
