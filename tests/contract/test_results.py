"""The result store contract, once per backend: Redis keys, SQLite and Postgres tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor import results
from conveyor.results import ResultRecord, ResultStore
from tests.conftest import POSTGRES_URL, REDIS_URL, clean_transport, require_service

BACKENDS: dict[str, tuple[str | None, Callable[[Path, str], str]]] = {
    "sqlite": (None, lambda tmp, name: f"sqlite:///{tmp}/results.db"),
    "redis": ("redis", lambda tmp, name: f"{REDIS_URL}?prefix={name}"),
    "postgres": ("postgres", lambda tmp, name: f"{POSTGRES_URL}?schema={name}"),
}


@pytest.fixture(params=list(BACKENDS))
def open_store(request: pytest.FixtureRequest, tmp_path: Path,
               unique: str) -> Iterator[Callable[[], ResultStore]]:
    """Opens stores on one backend (as many as a test needs); closes and cleans up after."""
    service, make_url = BACKENDS[request.param]
    if service:
        require_service(service)
    url = make_url(tmp_path, unique)
    opened: list[ResultStore] = []

    def open_one() -> ResultStore:
        opened.append(results.from_url(url))
        return opened[-1]

    yield open_one
    for store in opened:
        store.close()
    clean_transport(str(request.param), unique)


def test_a_stored_record_reads_back_whole(open_store: Callable[[], ResultStore]) -> None:
    store = open_store()
    value = {"rows": 3, "path": "/data/orders.csv", "nested": [1, 2.5, None, "ü"]}
    assert store.put("m1", ResultRecord("succeeded", value=value, task="t.x", attempt=2), 60)
    got = store.get("m1")
    assert got is not None and (got.status, got.value, got.task, got.attempt) == (
        "succeeded", value, "t.x", 2)
    assert store.get("nobody") is None


def test_the_first_write_wins(open_store: Callable[[], ResultStore]) -> None:
    """A redelivered message's second run never replaces the value already stored."""
    first, second = open_store(), open_store()
    assert first.put("m", ResultRecord("succeeded", value="first"), 60)
    assert not second.put("m", ResultRecord("succeeded", value="second"), 60)
    assert not second.put("m", ResultRecord("failed", error={"type": "X"}), 60)
    got = first.get("m")
    assert got is not None and got.value == "first"


def test_failures_keep_type_message_and_traceback(open_store: Callable[[], ResultStore]) -> None:
    store = open_store()
    error = {"type": "ValueError", "message": "bad day", "traceback": "Traceback...\nValueError"}
    store.put("m", ResultRecord("failed", error=error, reason="budget spent"), 60)
    got = store.get("m")
    assert got is not None and got.error == error and got.reason == "budget spent"


def test_wait_wakes_when_another_store_puts(open_store: Callable[[], ResultStore]) -> None:
    waiter, writer = open_store(), open_store()
    woke: list[float] = []
    put_at: list[float] = []

    def wait() -> None:
        found = waiter.wait("m", 60)
        woke.append(time.monotonic())
        assert found is not None and found.value == 42

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)  # let the waiter subscribe and sleep (a put before is also fine)
    put_at.append(time.monotonic())
    writer.put("m", ResultRecord("succeeded", value=42), 60)
    thread.join(60)
    assert woke, "wait did not return"
    assert woke[0] - put_at[0] < 20, "wait slept far past the put: not woken by it (60 s)"


def test_wait_returns_at_once_when_already_stored(open_store: Callable[[], ResultStore]) -> None:
    store = open_store()
    store.put("m", ResultRecord("dead_lettered", reason="unknown task"), 60)
    started = time.monotonic()
    found = store.wait("m", 60)
    assert found is not None and found.status == "dead_lettered"
    assert time.monotonic() - started < 20  # at once, not at its 60 s timeout


def test_wait_gives_none_at_its_timeout(open_store: Callable[[], ResultStore]) -> None:
    store = open_store()
    started = time.monotonic()
    assert store.wait("never", 0.3) is None
    assert 0.25 <= time.monotonic() - started < 10


def test_records_expire(open_store: Callable[[], ResultStore]) -> None:
    store = open_store()
    store.put("m", ResultRecord("succeeded", value=1), 0.2)
    deadline = time.monotonic() + 10
    while store.get("m") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.get("m") is None
    assert store.put("m", ResultRecord("succeeded", value=2), 60), "an expired key is free"
    got = store.get("m")
    assert got is not None and got.value == 2
