"""Shared fixtures: real services on loopback, a unique name per test, nothing left running.

A service that is down skips its tests on a developer's machine and fails them in CI
(`CI=true`): CI must never pass by skipping.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

SERVICES = {
    "redis": ("127.0.0.1", 6379),
    "postgres": ("127.0.0.1", 5432),
    "rabbitmq": ("127.0.0.1", 5672),
}
REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBITMQ_MANAGEMENT = "http://127.0.0.1:15672"


def require_service(name: str) -> None:
    """Skip (or, in CI, fail) unless the named service accepts connections."""
    host, port = SERVICES[name]
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        message = f"{name} is not reachable at {host}:{port} ({exc}); start it (see README)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@contextmanager
def opened_brokers(url: str, factory: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """`make(url=…, **options)` opens a broker; every one opened is closed at the end."""
    opened: list[Any] = []

    def make(broker_url: str = url, **options: Any) -> Any:
        broker = factory(broker_url, **options)
        opened.append(broker)
        return broker

    try:
        yield make
    finally:
        for broker in opened:
            broker.close()


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """A daemon command run in-process (`cli.main(["autoscaler", ...])`) sets up logging on
    the root logger with the stderr pytest captured for that test; left behind, it makes
    every later test's library log lines (pika's INFO) fail to write to a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def unique() -> str:
    """A short name no other test (or test run) uses: for queues, schemas, keys."""
    return "t" + uuid.uuid4().hex[:12]


def drop_postgres_schema(name: str) -> None:
    """Drop a schema a test's broker or store created (names are per test, never shared)."""
    import psycopg
    from psycopg import sql
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(params=["sqlite", "postgres"])
def state_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    """A state store URL on each database: an SQLite file in the test's temp dir, and a
    Postgres schema of the test's own (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/state.db"
        return
    require_service("postgres")
    yield f"{POSTGRES_URL}?schema={unique}"
    drop_postgres_schema(unique)


def delete_redis_prefix(prefix: str) -> None:
    """Delete every key under a test's own prefix (never FLUSHDB: the server is shared)."""
    import redis
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def delete_rabbitmq_queues(name: str) -> None:
    """Delete every queue whose name holds a test's unique name (its dead-letter and delay
    queues too) through the management API: purging leaves quorum queues behind, and each
    one holds file descriptors on the shared server until it runs out of them."""
    import base64
    import json
    import urllib.parse
    import urllib.request

    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}

    def call(method: str, path: str) -> object:
        request = urllib.request.Request(f"{RABBITMQ_MANAGEMENT}{path}", method=method,
                                         headers=auth)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    try:
        queues = call("GET", "/api/queues/%2F?columns=name")
    except OSError:
        return  # no management API: nothing we can list
    for queue in queues if isinstance(queues, list) else []:
        if name in queue["name"]:
            call("DELETE", "/api/queues/%2F/" + urllib.parse.quote(queue["name"], safe=""))


def clean_transport(transport: str, name: str) -> None:
    """Remove what a test left on a shared server under its unique name."""
    if transport == "postgres":
        drop_postgres_schema(name)
    elif transport in ("redis", "kombu+redis"):
        delete_redis_prefix(name)
    elif transport in ("rabbitmq", "kombu+amqp"):
        delete_rabbitmq_queues(name)
