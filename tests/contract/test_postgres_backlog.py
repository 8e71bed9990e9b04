"""A Postgres queue under a backlog: the claim's cost must not grow with what is queued.

A claim used to sort every ready row when the planner had no statistics (a freshly filled
table), and to walk the entries claims and acks left at the head of its index. These tests
fill 100,000 messages through the broker and read the claim's plan and the pages it touches,
never a wall-clock time: what they check holds on a loaded machine as on an idle one.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conveyor.broker import Publication
from conveyor.broker.pgvacuum import Vacuum
from conveyor.broker.postgres import PostgresBroker, Q, parse_url
from conveyor.errors import ConfigError
from tests.conftest import POSTGRES_URL, opened_brokers, require_service
from tests.contract.conftest import OpenPgBroker
from tests.support import wait_for

Plan = dict[str, Any]
BACKLOG = 100_000
INDEXES = {"conveyor_messages_pkey", "conveyor_messages_ready", "conveyor_messages_waiting"}


@pytest.fixture
def db(pg_url: str, unique: str) -> Iterator[psycopg.Connection[Any]]:
    """A session of our own in the test's schema, as the broker's sessions are."""
    with psycopg.connect(POSTGRES_URL, autocommit=True,
                         options=f"-c search_path={unique}") as conn:
        yield conn


def fill(broker: PostgresBroker, queue: str, n: int = BACKLOG, delay: float = 0.0) -> None:
    """`n` messages through the broker's own batch publish, 10,000 per transaction."""
    for start in range(0, n, 10_000):
        broker.publish_many([Publication(queue, b'{"v":1}', delay=delay)
                             for _ in range(min(10_000, n - start))])


def claim_plan(db: psycopg.Connection[Any], queue: str, limit: int,
               analyze: bool = False) -> Plan:
    """EXPLAIN of the broker's claim statement; ANALYZE runs it, so it is rolled back."""
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    params = {"queue": queue, "limit": limit, "lease": uuid.uuid4(), "lease_seconds": 30,
              "ids": [], "leases": [], "flush": False}
    with db.transaction(force_rollback=True):
        row = db.execute(f"EXPLAIN ({options}) {Q['claim']}", params).fetchone()
    assert row is not None
    plan: Plan = row[0][0]["Plan"]
    return plan


def nodes(plan: Plan) -> Iterator[Plan]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def table_scans(plan: Plan) -> list[Plan]:
    """The nodes that read conveyor_messages (the UPDATE's own node writes it)."""
    return [n for n in nodes(plan) if n.get("Relation Name") == "conveyor_messages"
            and n["Node Type"] != "ModifyTable"]


def assert_claims_in_index_order(plan: Plan) -> None:
    """Every read of the table goes through an index; nothing sorts what a scan returned,
    only the two index heads' few candidates (CTE scans, at most 2 x limit rows)."""
    scans = table_scans(plan)
    assert {(n["Node Type"], n.get("Index Name")) for n in scans} >= {
        ("Index Scan", "conveyor_messages_ready"), ("Index Scan", "conveyor_messages_waiting")}
    assert all(n["Node Type"] == "Index Scan" and n["Index Name"] in INDEXES
               for n in scans), scans
    sorts = [n for n in nodes(plan) if n["Node Type"] in ("Sort", "Incremental Sort")]
    assert not [s for s in sorts if table_scans(s)], sorts


def ready_index_pages(plan: Plan) -> int:
    """Buffers the scan of the ready index touched (its pages, and the heap rows it locked)."""
    [scan] = [n for n in nodes(plan) if n.get("Index Name") == "conveyor_messages_ready"]
    return int(scan["Shared Hit Blocks"]) + int(scan["Shared Read Blocks"])


@pytest.mark.parametrize("delayed", [0, BACKLOG], ids=["all-ready", "mostly-delayed"])
def test_the_claim_reads_the_ready_index_in_order_before_and_after_analyze(
        open_pg_broker: OpenPgBroker, db: psycopg.Connection[Any], unique: str,
        delayed: int) -> None:
    """Mostly delayed: statistics that say next to nothing is ready, and then a burst."""
    broker = open_pg_broker()
    fill(broker, unique, delayed, delay=3600)
    fill(broker, unique, BACKLOG - delayed or 1_000)
    for limit in (1, 32):
        assert_claims_in_index_order(claim_plan(db, unique, limit))
    db.execute("ANALYZE conveyor_messages")
    fill(broker, unique, 10_000)
    for limit in (1, 32):
        assert_claims_in_index_order(claim_plan(db, unique, limit))
    plan = claim_plan(db, unique, 1, analyze=True)
    assert plan["Actual Rows"] == 1
    assert ready_index_pages(plan) <= 10, plan


def test_a_claim_planned_while_the_queue_was_small_is_planned_again_for_a_backlog(
        open_pg_broker: OpenPgBroker, db: psycopg.Connection[Any], unique: str) -> None:
    """Postgres may keep one generic plan for a statement psycopg prepared; made on a small,
    vacuumed table it sorts a sequential scan, and keeps it after 100,000 rows arrive (20 ms
    a claim). The broker's sessions plan every execution for the table as it then is."""
    broker = open_pg_broker()
    fill(broker, unique, 30)
    db.execute("VACUUM ANALYZE conveyor_messages")  # the statistics of a tiny table
    drain(broker, unique, 20, batch=1)  # prepared (psycopg: 5 runs), then planned again
    fill(broker, unique)
    drain(broker, unique, 20, batch=1)
    plans = broker._run("plans", lambda cur: cur.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
        "WHERE statement LIKE %s", ("%lock up to :limit ready rows%",)).fetchall())
    assert plans and all(generic == 0 and custom >= 30 for generic, custom in plans), plans


def drain(broker: PostgresBroker, queue: str, n: int, batch: int = 16) -> None:
    """Claim and ack `n` messages as a worker does: `batch` a claim, acked in one statement.
    The broker's VACUUM moves a step at each claim (its connect takes a few): tests that
    need it to get far in a few hundred messages claim them one at a time."""
    held = []
    for delivery in broker.consume([queue], prefetch=batch, timeout=5):
        assert delivery is not None, "the backlog ran dry"
        held.append(delivery)
        if len(held) == batch or n - len(held) <= 0:
            assert broker.ack_many(held) == []
            n -= len(held)
            held = []
        if n <= 0:
            return


def vacuum_running(db: psycopg.Connection[Any], broker: PostgresBroker) -> bool:
    row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                     "AND state = 'active'", (f"{broker.name}:vacuum",)).fetchone()
    return row is not None and row[0] > 0


@contextmanager
def own_database(name: str) -> Iterator[str]:
    """The URL of a database made for the test and dropped after it.

    VACUUM may not remove an entry that any open transaction in the same database could
    still see; on the shared server every other test's (a neighbour's 10,000-row publish, a
    scheduler's transaction) would decide what this test's VACUUMs leave behind.
    """
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{POSTGRES_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))


def queue_without_autovacuum(make: OpenPgBroker, url: str, schema: str,
                             every: int) -> tuple[PostgresBroker, psycopg.Connection[Any]]:
    """A broker vacuuming every `every` claims, and a session of ours, on a table autovacuum
    leaves alone: its VACUUM would clean the control, and make the broker's skip theirs."""
    broker = make(f"{url}?schema={schema}&vacuum_every={every}")
    db = psycopg.connect(url, autocommit=True, options=f"-c search_path={schema}")
    db.execute("ALTER TABLE conveyor_messages SET (autovacuum_enabled = off)")
    return broker, db


def claim_until_vacuumed(broker: PostgresBroker, queue: str) -> None:
    """Claim until the broker opens a VACUUM's session, then only step that VACUUM (a claim
    of no rows) until it has finished: every claim is then behind its horizon. The periodic
    ones may have started up to `vacuum_every` claims, and under load more, before the end."""
    vacuum = broker._vacuum
    before = vacuum.started
    deadline = time.monotonic() + 60
    while vacuum.started == before:
        drain(broker, queue, 16)
    while vacuum.under_way:
        assert time.monotonic() < deadline, "the broker's VACUUM did not finish within 60 s"
        vacuum.claimed(0)
        time.sleep(0.01)
    assert vacuum.finished >= 1


def test_claims_and_acks_leave_no_pile_of_dead_entries_at_the_head(unique: str) -> None:
    """The broker's VACUUMs, every 2,000 claims here, remove what 20,000 claims and acks
    left at the head of the ready index; without them a claim steps over all 20,000.

    Measured after a VACUUM that started once the drain was over: the last periodic one may
    have started up to 2,000-odd claims before the end, leaving 4-38 pages, and a neighbour's
    transaction on a loaded server once made it 64 (hence also a database of our own).
    """
    require_service("postgres")
    with own_database(unique) as url, opened_brokers(url, PostgresBroker) as make:
        broker, db = queue_without_autovacuum(make, url, unique, every=2000)
        with db:
            fill(broker, unique)
            drain(broker, unique, 20_000)
            claim_until_vacuumed(broker, unique)
            assert vacuums(db, unique) >= 5  # periodic: about 10
            after = ready_index_pages(claim_plan(db, unique, 1, analyze=True))
        control, db = queue_without_autovacuum(make, url, f"{unique}x", every=0)
        with db:
            fill(control, unique)
            drain(control, unique, 20_000)
            piled = ready_index_pages(claim_plan(db, unique, 1, analyze=True))
        assert after <= 12 and piled >= 80, (after, piled)  # seen: 4-5 and 124-233


VERSION_1 = """
INSERT INTO conveyor_messages (queue, body, available_at, locked_until, lease, deliveries,
                               dead_reason, dead_at) VALUES
    (%(q)s, 'ready', now(), NULL, NULL, 0, NULL, NULL),
    (%(q)s, 'delayed', now() + interval '3 seconds', NULL, NULL, 0, NULL, NULL),
    (%(q)s, 'in flight', now(), now() + interval '1 hour', gen_random_uuid(), 1, NULL, NULL),
    (%(q)s, 'dead', now(), NULL, NULL, 3, 'poison', now())
"""
#: What `publish` with a delay inserted before migration_2.
OLD_DELAYED_PUBLISH = """
INSERT INTO conveyor_messages (queue, body, priority, available_at)
VALUES (%(q)s, 'old publisher', 0, now() + interval '3 seconds')
"""


def test_a_version_1_queue_is_upgraded_in_place_keeping_every_state(
        open_pg_broker: OpenPgBroker, db: psycopg.Connection[Any], unique: str) -> None:
    """Also while code from before the upgrade still publishes to it (a rolling upgrade):
    its delayed message has no locked_until, and must wait all the same."""
    with db.transaction():
        db.execute(sql.SQL(Q["create_schema"]).format(schema=sql.Identifier(unique)))
        db.execute(Q["migration_1"])
        db.execute(Q["record_migration"], {"version": 1})
        db.execute(VERSION_1, {"q": unique})
    broker = open_pg_broker()
    indexes = {r[0] for r in db.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s "
        "AND tablename = 'conveyor_messages'", (unique,))}
    assert indexes == INDEXES
    db.execute(OLD_DELAYED_PUBLISH, {"q": unique})
    depth = broker.depth(unique)
    assert (depth.ready, depth.in_flight, depth.delayed, depth.dead) == (1, 1, 2, 1)
    got: list[bytes] = []
    for delivery in broker.consume([unique], timeout=15):
        assert delivery is not None, f"only {got} within 15 s"
        got.append(delivery.body)
        broker.ack(delivery)
        if got == [b"ready"]:
            assert broker.depth(unique).delayed == 2, "a delayed row was claimed early"
        if len(got) == 3:
            break
    assert got[0] == b"ready" and sorted(got[1:]) == [b"delayed", b"old publisher"]
    assert [d.body for d in broker.dead_letters(unique)] == [b"dead"]
    assert broker.depth(unique).in_flight == 1


def test_a_consumer_that_may_not_vacuum_says_so_once_and_keeps_claiming(
        open_pg_broker: OpenPgBroker, db: psycopg.Connection[Any], unique: str,
        caplog: pytest.LogCaptureFixture) -> None:
    owner = open_pg_broker()
    fill(owner, unique, 50)
    role = sql.Identifier(f"{unique}_role")
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
    try:
        for grant in ("GRANT USAGE ON SCHEMA {s} TO {r}",
                      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}"):
            db.execute(sql.SQL(grant).format(s=sql.Identifier(unique), r=role))
        guest = open_pg_broker(f"postgresql://{unique}_role@127.0.0.1:5432/postgres"
                            f"?schema={unique}&vacuum_every=5")
        with caplog.at_level(logging.WARNING, logger="conveyor.broker.postgres"):
            drain(guest, unique, 48, batch=1)
            guest.close()
        said = [r.getMessage() for r in caplog.records if "may not VACUUM" in r.getMessage()]
        assert len(said) == 1, said
        assert "owner" in said[0] and "vacuum_every=0" in said[0]
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(role))
        db.execute(sql.SQL("DROP ROLE {}").format(role))


def vacuums(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = "
                     "'conveyor_messages' AND schemaname = %s", (schema,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_vacuum_that_meets_another_is_skipped_quietly_and_tried_again(
        open_pg_broker: OpenPgBroker, pg_url: str, db: psycopg.Connection[Any], unique: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """SKIP_LOCKED meeting another VACUUM (here, a lock a VACUUM would take) warns "lock not
    available": that is no refusal, and the next try, 100 claims later, runs."""
    broker = open_pg_broker(f"{pg_url}&vacuum_every=100")
    fill(broker, unique, 1_000)
    with caplog.at_level(logging.DEBUG, logger="conveyor.broker.postgres"), \
            psycopg.connect(POSTGRES_URL, options=f"-c search_path={unique}") as locker:
        locker.execute("LOCK TABLE conveyor_messages IN SHARE UPDATE EXCLUSIVE MODE")
        drain(broker, unique, 300, batch=1)
        assert vacuums(db, unique) == 0
        locker.rollback()
        drain(broker, unique, 300, batch=1)
    wait_for(lambda: not vacuum_running(db, broker), 60, "the broker's VACUUM to finish")
    assert vacuums(db, unique) >= 1
    said = [r.getMessage() for r in caplog.records]
    assert any("lock not available" in m for m in said), said
    assert not [m for m in said if "may not VACUUM" in m]


@pytest.mark.parametrize("server, said", [("silent", "no connection within 0.5 s"),
                                           ("gone", "refused")])
def test_a_vacuum_session_that_cannot_connect_never_holds_up_a_claim(
        server: str, said: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server that takes the TCP connection and never answers, or none at all: each claim
    steps the connect without waiting, the try is dropped (DEBUG), nothing is raised."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        if server == "gone":
            silent.close()
        vacuum = Vacuum(f"host=127.0.0.1 port={port} user=postgres dbname=postgres "
                        "sslmode=disable", 0.5, every=1, where="the test's server")
        with caplog.at_level(logging.DEBUG, logger="conveyor.broker.postgres"):
            deadline = time.monotonic() + 30
            while not any(said in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                started = time.monotonic()
                vacuum.claimed(1)
                assert time.monotonic() - started < 5, "a claim waited for the connect"
                time.sleep(0.05)
        vacuum.close()
    assert vacuum.finished == 0


@pytest.mark.parametrize("option, every", [("", 10_000), ("&vacuum_every=0", 0),
                                           ("&vacuum_every=500", 500)])
def test_vacuum_every_is_a_url_option(option: str, every: int) -> None:
    settings = parse_url(f"postgresql://u@db/app?schema=jobs{option}")
    assert settings.vacuum_every == every and "vacuum_every" not in settings.params


@pytest.mark.parametrize("value", ["-1", "often", "1.5"])
def test_a_bad_vacuum_every_stops_at_start_with_a_clear_error(value: str) -> None:
    with pytest.raises(ConfigError, match=f"vacuum_every='{value}'; use a whole number"):
        parse_url(f"postgresql://u:secret@db/app?vacuum_every={value}")
