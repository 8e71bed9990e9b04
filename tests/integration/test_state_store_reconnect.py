"""The Postgres state store (and results and the limiter on it) through a lost session (issue
31, Postgres failover): what was in progress is said to be lost (`StateStoreLost`), the next
use opens a new session, LISTENs again, and finds the host that takes writes among several.
The outage is a `Proxy` cut under the store (the shared server is never touched); a session on
a read-only server (SQLSTATE 25006, what a standby answers) is one made read-only by its
options. The failover itself, a standby promoted under a running scheduler, is
tests/integration/test_postgres_failover.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from conveyor.errors import StateStoreLost
from conveyor.limits.sql import PostgresLimiter
from conveyor.results.base import ResultRecord
from conveyor.results.sql import SQLResults
from conveyor.state.store import PostgresStore, from_url
from tests.conftest import POSTGRES_URL, require_service
from tests.support import Proxy, free_port, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def schema(unique: str) -> Iterator[str]:
    require_service("postgres")
    yield unique
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(unique)))


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    relay = Proxy("127.0.0.1", 5432)
    yield relay
    relay.cut()


def test_a_lost_session_is_said_and_the_next_use_connects_again_and_listens_again(
        schema: str, proxy: Proxy) -> None:
    store = from_url(f"postgresql://postgres@{proxy.address}/postgres?schema={schema}")
    assert isinstance(store, PostgresStore)
    try:
        store.listen("conveyor_test_wake")
        assert store.one("schema_version") is not None
        proxy.cut()
        with pytest.raises(StateStoreLost):   # at once: the caller reads again
            store.notifications(30)
        proxy.restore()
        assert store.one("schema_version") is not None   # a new session, schema and all
        with psycopg.connect(POSTGRES_URL, autocommit=True) as other:
            other.execute("SELECT pg_notify('conveyor_test_wake', 'hello')")
        assert store.notifications(30) == ["hello"]   # LISTENing again on the new session
        proxy.cut()
        with pytest.raises(StateStoreLost, match="session lost"), store.transaction():
            store.one("schema_version")
        proxy.restore()
        with store.transaction():
            assert store.one("schema_version") is not None
    finally:
        store.close()


def test_of_several_hosts_the_store_takes_the_one_that_answers(schema: str) -> None:
    dead = free_port()   # nothing listens there: a primary that died
    store = from_url(f"postgresql://postgres@127.0.0.1:{dead},127.0.0.1:5432/postgres"
                     f"?schema={schema}")
    try:
        assert store.one("schema_version") is not None
    finally:
        store.close()


def test_a_session_on_a_read_only_server_is_lost_not_a_failed_query(schema: str) -> None:
    from_url(f"{POSTGRES_URL}?schema={schema}").close()   # the tables, made writable
    readonly = PostgresStore(f"{POSTGRES_URL}?schema={schema}&options=-c%20default_"
                             "transaction_read_only%3Don")
    try:
        with pytest.raises(StateStoreLost, match="read-only"):
            readonly.exec("set_schema_version", version=0)
        assert readonly._db.closed   # closed: the next use opens one where writes go
    finally:
        readonly.close()


def test_a_result_waiter_cut_off_reads_again_and_finds_what_was_stored_meanwhile(
        schema: str, proxy: Proxy) -> None:
    """Its notification was sent while its session was gone: it reads again on the new
    session instead of sleeping to its timeout."""
    name = f"waiter_{schema}"
    waiter = SQLResults(f"postgresql://postgres@{proxy.address}/postgres?schema={schema}"
                        f"&application_name={name}")
    writer = SQLResults(f"{POSTGRES_URL}?schema={schema}")
    got: list[ResultRecord | None] = []
    thread = threading.Thread(target=lambda: got.append(waiter.wait("m1", 60)))
    try:
        thread.start()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as watch:
            wait_for(lambda: watch.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'"
                " AND query LIKE 'SELECT%%'", (name,)).fetchone(), 30, "the waiter asleep")
        proxy.cut()
        assert writer.put("m1", ResultRecord("succeeded", value=42), ttl=60)
        proxy.restore()
        thread.join(60)
        assert got and got[0] is not None and got[0].value == 42
    finally:
        thread.join(60)
        waiter.close()
        writer.close()


def test_the_limiter_opens_a_lost_session_again_at_its_next_use(
        schema: str, proxy: Proxy) -> None:
    """The call that found the session lost fails (its caller decides); the next one runs on
    a new session, wherever libpq finds the primary."""
    limiter = PostgresLimiter(f"postgresql://postgres@{proxy.address}/postgres?schema={schema}")
    try:
        assert limiter.cancels(time.time()) == []
        proxy.cut()
        with pytest.raises(psycopg.OperationalError):
            limiter.cancels(time.time())
        proxy.restore()
        assert limiter.cancels(time.time()) == []
    finally:
        limiter.close()
