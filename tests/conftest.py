"""Shared fixtures: real services on loopback, a unique name per test, nothing left running.

A service that is down skips its tests on a developer's machine and fails them in CI
(`CI=true`): CI must never pass by skipping.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

# The suite shares two cores with brokers and worker processes: a generated example may take
# seconds to build under that load. Hypothesis's timing checks measure the machine, not the code.
hypothesis_settings.register_profile("shared-machine", deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("shared-machine")


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


#: Every `unique` name this process handed out: the end-of-run check looks for these only.
ISSUED: set[str] = set()


@pytest.fixture
def unique() -> str:
    """A short name no other test (or test run) uses: for queues, schemas, keys."""
    name = "t" + uuid.uuid4().hex[:12]
    ISSUED.add(name)
    return name


def drop_postgres_schema(name: str) -> None:
    """Drop a schema a test's broker or store created (names are per test, never shared)."""
    import psycopg
    from psycopg import sql
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[Any]]]:
    """Child processes a test starts (append each one): when it ends, those still running
    are killed by pid (never by name) and every one is reaped and its pipes closed, so none
    outlives the test, however it ended."""
    started: list[subprocess.Popen[Any]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


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


def rabbitmq_management(method: str, path: str, timeout: float = 30) -> object:
    """One call to RabbitMQ's management API (guest), its JSON answer decoded."""
    import base64
    import json
    import urllib.request

    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    request = urllib.request.Request(f"{RABBITMQ_MANAGEMENT}{path}", method=method,
                                     headers=auth)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def delete_rabbitmq_queues(name: str) -> None:
    """Delete every queue whose name holds a test's unique name (its dead-letter and delay
    queues too) through the management API: purging leaves quorum queues behind, and each
    one holds file descriptors on the shared server until it runs out of them."""
    import urllib.parse

    try:
        queues = rabbitmq_management("GET", "/api/queues/%2F?columns=name")
    except OSError:
        return  # no management API: nothing we can list
    for queue in queues if isinstance(queues, list) else []:
        if name in queue["name"]:
            rabbitmq_management("DELETE",
                                "/api/queues/%2F/" + urllib.parse.quote(queue["name"], safe=""))


def clean_transport(transport: str, name: str) -> None:
    """Remove what a test left on a shared server under its unique name."""
    if transport == "postgres":
        drop_postgres_schema(name)
    elif transport in ("redis", "kombu+redis"):
        delete_redis_prefix(name)
    elif transport in ("rabbitmq", "kombu+amqp"):
        delete_rabbitmq_queues(name)


UNIQUE_IN = re.compile(r"t[0-9a-f]{12}")


def leftover_rabbitmq_queues(issued: set[str]) -> list[str]:
    """The RabbitMQ queues whose names hold one of `issued` (this run's unique names).

    Only names this run made count: other engineers and CI use the same server at the same
    time, so a queue named otherwise (even `default`) proves nothing about this run. One
    GET with a 1 s timeout; an unreachable management API reports nothing."""
    if not issued:
        return []
    import http.client
    try:
        queues = rabbitmq_management("GET", "/api/queues/%2F?columns=name", timeout=1)
    except (OSError, ValueError, http.client.HTTPException):
        return []  # no (or no sane) management API: the check is a help, never a failure
    names = [q["name"] for q in queues] if isinstance(queues, list) else []
    return sorted(n for n in names if issued.intersection(UNIQUE_IN.findall(n)))


#: Leftover queues found by this process or reported by the xdist workers.
LEFTOVERS: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Look for the queues this process's tests left on RabbitMQ; under xdist each worker
    hands its list to the controller (workeroutput), which prints them all."""
    left = leftover_rabbitmq_queues(ISSUED)
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["leftover_queues"] = left
    else:
        LEFTOVERS.extend(left)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist (controller): collect what a worker found when it finished."""
    LEFTOVERS.extend(getattr(node, "workeroutput", {}).get("leftover_queues", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the queues this run's tests left on the shared RabbitMQ: each is a test whose
    cleanup misses a name (fix that test; the queue itself can go with
    `rabbitmqctl delete_queue NAME`)."""
    if LEFTOVERS:
        terminalreporter.section("queues this run left on RabbitMQ", yellow=True)
        for name in sorted(LEFTOVERS):
            terminalreporter.write_line(name)
