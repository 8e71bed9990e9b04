"""What only the Postgres transport has to prove: sessions that die, schemas that race.

The conformance suite (`test_contract.py`) covers the semantics; these tests kill the
transport's own sessions with `pg_terminate_backend` (found by application_name) and start
several processes on one fresh schema at once.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conveyor.broker.postgres import POLL_FALLBACK, PostgresBroker, parse_url
from conveyor.errors import BrokerError, ConfigError, LeaseLost
from tests.conftest import POSTGRES_URL, opened_brokers, require_service
from tests.contract.conftest import ENV
from tests.support import wait_for

OpenBroker = Callable[..., PostgresBroker]
LOGGER = "conveyor.broker.postgres"


@pytest.fixture(scope="session")
def made_schemas() -> Iterator[list[str]]:
    """Schemas the tests of this file created; dropped once, when the session ends."""
    names: list[str] = []
    yield names
    if names:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(name)))


@pytest.fixture
def pg_url(unique: str, made_schemas: list[str]) -> str:
    require_service("postgres")
    made_schemas.append(unique)
    return f"{POSTGRES_URL}?schema={unique}"


@pytest.fixture
def open_broker(pg_url: str) -> Iterator[OpenBroker]:
    """Open brokers on the test's schema; all are closed when the test ends."""
    with opened_brokers(pg_url, PostgresBroker) as make:
        yield make


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[Any]]:
    require_service("postgres")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        yield conn


def session_pids(admin: psycopg.Connection[Any], broker: PostgresBroker) -> dict[str, int]:
    """The broker's live sessions: role ("main", "listen") -> backend pid."""
    rows = admin.execute("SELECT application_name, pid FROM pg_stat_activity "
                         "WHERE application_name LIKE %s", (f"{broker.name}:%",)).fetchall()
    return {name.rsplit(":", 1)[1]: pid for name, pid in rows}


def listening(admin: psycopg.Connection[Any], broker: PostgresBroker) -> bool:
    """Both sessions idle, the listening one after its LISTEN: from here a NOTIFY wakes the
    consumer (in select(), or at once when it gets there: the notification is buffered)."""
    rows = admin.execute("SELECT application_name, state, query FROM pg_stat_activity "
                         "WHERE application_name LIKE %s", (f"{broker.name}:%",)).fetchall()
    seen = {name.rsplit(":", 1)[1]: (state, query) for name, state, query in rows}
    return set(seen) == {"main", "listen"} and all(s == "idle" for s, _ in seen.values()) \
        and seen["listen"][1].startswith("LISTEN")


def terminate(admin: psycopg.Connection[Any], pids: dict[str, int]) -> None:
    """Kill these sessions and wait (up to 5 s) until they are gone."""
    for pid in pids.values():
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (
            True,)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING]


def test_consumer_reconnects_and_is_still_woken_after_its_sessions_die(
        open_broker: OpenBroker, admin: psycopg.Connection[Any], unique: str,
        caplog: pytest.LogCaptureFixture) -> None:
    queue = f"q-{unique}"
    consumer, producer = open_broker(), open_broker()
    steps = consumer.consume([queue], timeout=30)

    def kill_then_publish() -> float:
        wait_for(lambda: listening(admin, consumer), 10, "the consumer to LISTEN")
        before = session_pids(admin, consumer)
        terminate(admin, before)
        wait_for(lambda: _all_replaced(session_pids(admin, consumer), before), 10)
        wait_for(lambda: listening(admin, consumer), 10, "the consumer to LISTEN again")
        published = time.monotonic()
        producer.publish(queue, b"after the reconnect")
        return published

    with caplog.at_level(logging.WARNING, logger=LOGGER), ThreadPoolExecutor(1) as pool:
        killer = pool.submit(kill_then_publish)
        delivery = next(steps)
        published = killer.result(timeout=30)
    assert delivery is not None and delivery.body == b"after the reconnect"
    waited = time.monotonic() - published
    assert waited < POLL_FALLBACK / 2, f"woken by the poll fallback, not NOTIFY ({waited:.2f} s)"
    consumer.ack(delivery)
    said = warnings_of(caplog)
    assert any("listening" in m and "reconnecting" in m for m in said), said


def _all_replaced(now: dict[str, int], before: dict[str, int]) -> bool:
    return set(now) == set(before) and not set(now.values()) & set(before.values())


def test_publisher_reconnects_after_its_session_dies(
        open_broker: OpenBroker, admin: psycopg.Connection[Any], unique: str,
        caplog: pytest.LogCaptureFixture) -> None:
    queue = f"q-{unique}"
    producer, consumer = open_broker(), open_broker()
    producer.publish(queue, b"before")
    terminate(admin, session_pids(admin, producer))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        producer.publish(queue, b"after")
    said = warnings_of(caplog)
    assert any("publish" in m and "reconnecting" in m for m in said), said
    got = []
    for delivery in consumer.consume([queue], prefetch=2, timeout=1.0):
        if delivery is None:
            break
        got.append(delivery.body)
        consumer.ack(delivery)
    assert got == [b"before", b"after"]


MIGRATE = """
import sys
from conveyor.broker.postgres import PostgresBroker
print("ready", flush=True)
sys.stdin.readline()
PostgresBroker(sys.argv[1]).close()
"""


def test_processes_starting_on_one_fresh_schema_at_once_all_migrate_it(
        pg_url: str, admin: psycopg.Connection[Any], unique: str,
        processes: list[subprocess.Popen[bytes]]) -> None:
    for _ in range(4):
        processes.append(subprocess.Popen([sys.executable, "-c", MIGRATE, pg_url], env=ENV,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
    for proc in processes:  # all imported and waiting: then release them together
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    for proc in processes:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
    for proc in processes:
        assert proc.stderr is not None
        errors = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0, errors
    versions = admin.execute(sql.SQL("SELECT version FROM {}.conveyor_migrations").format(
        sql.Identifier(unique))).fetchall()
    assert versions == [(1,), (2,)]


def test_a_waiting_consumer_wakes_when_a_lease_expires_not_at_the_poll(
        open_broker: OpenBroker, unique: str) -> None:
    queue = f"q-{unique}"
    owner, rival = open_broker(lease_seconds=1.0), open_broker()
    owner.publish(queue, b"x")
    held = next(owner.consume([queue], timeout=5))
    assert held is not None
    started = time.monotonic()
    delivery = next(rival.consume([queue], timeout=30))
    waited = time.monotonic() - started
    assert delivery is not None and delivery.delivery_count == 2
    assert 0.5 < waited < POLL_FALLBACK - 1, f"woke after {waited:.2f} s for a 1 s lease"
    rival.ack(delivery)
    with pytest.raises(LeaseLost):
        owner.ack(held)


def test_synchronous_acks(open_broker: OpenBroker, pg_url: str, unique: str) -> None:
    queue = f"q-{unique}"
    broker = open_broker(f"{pg_url}&ack_commit=sync")
    assert broker.settings.ack_query == "ack"
    broker.publish(queue, b"x")
    delivery = next(broker.consume([queue], timeout=5))
    assert delivery is not None
    broker.ack(delivery)
    assert broker.depth(queue).active == 0


def test_url_options_are_taken_out_of_what_libpq_sees() -> None:
    settings = parse_url("postgresql://u:pw@db.example:5433/app?schema=jobs&ack_commit=sync"
                         "&sslmode=require&application_name=w1")
    assert (settings.schema, settings.ack_query) == ("jobs", "ack")
    assert settings.params["sslmode"] == "require" and settings.params["port"] == "5433"
    assert "schema" not in settings.params and "ack_commit" not in settings.params
    assert settings.params["options"] == ("-c search_path=jobs "
                                          "-c plan_cache_mode=force_custom_plan")
    assert parse_url(POSTGRES_URL).schema == "conveyor"


@pytest.mark.parametrize("option, complaint", [
    ("schema=Jobs", "schema 'Jobs' is not allowed"),
    ("schema=a-b", "schema 'a-b' is not allowed"),
    ("ack_commit=later", "use ack_commit=async"),
])
def test_bad_url_options_stop_at_start_with_a_clear_error(option: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint) as error:
        parse_url(f"postgresql://u:secret@db/app?{option}")
    assert "secret" not in str(error.value)


def test_a_closed_broker_says_so_instead_of_reconnecting(open_broker: OpenBroker,
                                                          unique: str) -> None:
    broker = open_broker()
    broker.close()
    with pytest.raises(BrokerError, match="is closed"):
        broker.publish(f"q-{unique}", b"x")
