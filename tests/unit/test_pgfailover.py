"""A Postgres URL naming a primary and its standby (libpq's multi-host form) is taken whole by
everything that takes a Postgres URL, connects to the host that takes writes, and commits
what a failover must not undo synchronously. Pure parsing: no server (the failover itself is
tests/integration/test_postgres_failover.py)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from conveyor import kinds
from conveyor.broker.pgurl import parse_url
from conveyor.limits.sql import parse_postgres_url
from conveyor.locations import store_urls
from conveyor.pgfailover import is_connection_loss, url_names_several_hosts
from conveyor.state.store import _split_schema

TWO = "postgresql://postgres@h1:5432,h2:5433/db"


def test_a_url_with_several_hosts_is_a_valid_setting_and_a_bad_port_among_them_is_named(
        ) -> None:
    assert kinds.url(TWO) == TWO
    assert kinds.url("postgresql://u:p@h1,h2:5433/db?x=1")
    with pytest.raises(ValueError, match="'h2:x'"):
        kinds.url("postgresql://h1:5432,h2:x/db")


@pytest.mark.parametrize("url, several", [
    (TWO, True), ("postgresql://u:p,w@h1/db", False), ("postgresql://h1/db?host=a,b", False),
    ("postgresql://[::1]:5432,[::1]:5433/db", True), ("postgresql://h1:5432/db", False)])
def test_several_hosts_are_told_from_the_netloc_alone(url: str, several: bool) -> None:
    assert url_names_several_hosts(url) is several


def test_the_broker_keeps_every_host_and_asks_for_the_primary_and_synchronous_commits(
        ) -> None:
    settings = parse_url(f"{TWO}?schema=s")
    assert settings.params["host"] == "h1,h2" and settings.params["port"] == "5432,5433"
    assert settings.params["target_session_attrs"] == "read-write"
    assert settings.ack_query == "ack"   # a failover must not undo an ack or a claim


def test_the_broker_url_may_choose_otherwise_and_one_host_is_as_before() -> None:
    chosen = parse_url(f"{TWO}?target_session_attrs=any&ack_commit=async")
    assert chosen.params["target_session_attrs"] == "any"
    assert chosen.ack_query == "ack_async"
    single = parse_url("postgresql://postgres@h1:5432/db")
    assert "target_session_attrs" not in single.params and single.ack_query == "ack_async"


def test_the_state_store_results_and_limits_ask_for_the_primary() -> None:
    conninfo, schema, retry = _split_schema(f"{TWO}?schema=s&retry_seconds=30")
    assert (schema, retry) == ("s", 30.0)
    params = conninfo_to_dict(conninfo)
    assert params["host"] == "h1,h2" and params["target_session_attrs"] == "read-write"
    assert "retry_seconds" not in params
    limits, _, async_commit = parse_postgres_url(f"{TWO}?schema=s")
    assert limits["target_session_attrs"] == "read-write" and not async_commit


def test_stores_beside_a_failover_broker_commit_synchronously() -> None:
    urls = store_urls(broker_url=TWO)
    assert "commit=async" not in urls.limits
    assert url_names_several_hosts(urls.results)
    assert "commit=async" in store_urls(broker_url="postgresql://h1/db").limits


def test_a_standby_answering_a_write_is_a_lost_session_and_a_bad_query_is_not() -> None:
    assert is_connection_loss(psycopg.errors.ReadOnlySqlTransaction("read-only"))
    assert is_connection_loss(psycopg.errors.AdminShutdown("terminating"))
    assert is_connection_loss(psycopg.OperationalError("server closed the connection"))
    assert not is_connection_loss(psycopg.errors.UndefinedTable("no such table"))
    assert not is_connection_loss(ValueError("not a database error"))


def test_a_step_cut_off_by_a_lost_session_is_run_again_and_a_stop_ends_that() -> None:
    import threading

    from conveyor.errors import StateStoreLost
    from conveyor.state.store import through_losses
    tries: list[int] = []

    def step() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise StateStoreLost("session lost")
        return "done"

    assert through_losses("a step", step) == "done" and len(tries) == 3
    stopping = threading.Event()
    stopping.set()
    tries.clear()
    with pytest.raises(StateStoreLost):
        through_losses("a step", step, stopping)
    assert len(tries) == 1
