"""`handle.result()` against real workers, on each broker with its default result store."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client import Client
from conveyor.config import Settings
from conveyor.errors import DeadLettered, ResultError, ResultTimeout, TaskFailed
from conveyor.message import Message
from conveyor.results import ResultHandle
from tests.conftest import clean_transport, require_service
from tests.contract.conftest import TRANSPORTS
from tests.integration.workerkit import (
    finish,
    start_worker,
    task_message,
    wait_event,
    worker_env,
)

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    service, make_url = TRANSPORTS[request.param]
    if service:
        require_service(service)
    yield make_url(tmp_path, unique)
    clean_transport(request.param, unique)


@pytest.fixture
def client(broker_url: str) -> Iterator[Client]:
    c = Client.from_settings(Settings(broker_url=broker_url))
    yield c
    c.close()


def send(client: Client, task: str, queue: str, *args: object) -> ResultHandle:
    return client.enqueue(task_message(task, queue, *args), keep_result=True)


def test_the_caller_gets_the_value(client: Client, broker_url: str, unique: str) -> None:
    handle = send(client, "t.add", unique, 20, 22)
    assert handle.status() == "pending"
    out = finish(start_worker(broker_url, unique))
    assert handle.result(timeout=30) == 42, out
    assert handle.status() == "succeeded"


def test_a_task_that_raises_skip_is_skipped_once_with_a_none_result(
        client: Client, broker_url: str, unique: str) -> None:
    """Skip is not a failure: acked on its first attempt (it has 3 retries), status
    'skipped', and result() returns None, as Airflow's skipped task has no XCom."""
    handle = send(client, "t.skip", unique, "nothing to do")
    out = finish(start_worker(broker_url, unique))
    assert handle.result(timeout=30) is None, out
    assert handle.status() == "skipped"
    assert "attempt=1 skipped" in out and "-> ack nothing to do" in out and "retry" not in out


def test_a_failure_for_good_is_raised_with_its_remote_traceback(
        client: Client, broker_url: str, unique: str) -> None:
    handle = send(client, "t.fail", unique, "bad day")  # max_retries=1: two attempts
    finish(start_worker(broker_url, unique))
    with pytest.raises(TaskFailed) as caught:
        handle.result(timeout=30)
    failure = caught.value
    assert (failure.error_type, failure.error_message) == ("ValueError", "bad day")
    assert "raise ValueError(message)" in failure.remote_traceback
    assert "ValueError: bad day" in str(failure) and "budget spent" in failure.reason
    assert handle.status() == "failed"


def test_a_quarantined_message_says_dead_lettered(client: Client, broker_url: str,
                                                  unique: str) -> None:
    handle = send(client, "t.nobody_registered_this", unique)
    finish(start_worker(broker_url, unique))
    with pytest.raises(DeadLettered, match="dead-lettered: unknown task"):
        handle.result(timeout=30)


def test_no_worker_is_a_timeout_that_says_so(client: Client, unique: str) -> None:
    handle = send(client, "t.add", unique, 1, 2)
    with pytest.raises(ResultTimeout, match="still queued or running"):
        handle.result(timeout=0.5)


@pytest.mark.parametrize("broker_url", ["sqlite"], indirect=True)
def test_a_result_over_the_cap_fails_the_attempt(client: Client, broker_url: str,
                                                 unique: str) -> None:
    handle = client.enqueue(task_message("t.add", unique, "x" * 300, "y", max_retries=0),
                            keep_result=True)
    env = worker_env(broker_url, CONVEYOR_RESULT_MAX_BYTES="100")
    finish(start_worker(broker_url, unique, env=env))
    with pytest.raises(TaskFailed, match="over the 100-byte cap"):
        handle.result(timeout=30)


@pytest.mark.parametrize("broker_url", ["sqlite"], indirect=True)
def test_messages_that_do_not_ask_are_never_written(client: Client, broker_url: str,
                                                    unique: str) -> None:
    plain = client.enqueue(task_message("t.add", unique, 1, 2))
    quiet = client.enqueue(task_message("t.quiet", unique, 1, 2),
                           keep_result=False)
    finish(start_worker(broker_url, unique))
    with pytest.raises(ResultError, match="did not ask for its result"):
        plain.result(timeout=1)
    assert client.results().get(plain.id) is None
    assert client.results().get(quiet.id) is None


@pytest.mark.parametrize("broker_url", ["sqlite"], indirect=True)
def test_kill_9_before_the_result_is_stored_gives_one_final_value(
        client: Client, broker_url: str, unique: str, tmp_path: Path) -> None:
    """The task returned, the worker is stuck storing its result (the test holds the
    results database's write lock), and is killed: the message is redelivered, runs again,
    and the caller gets that run's value, once."""
    log = tmp_path / "runs"
    store = client.results()   # creates results.db and its table
    url = Settings(broker_url=broker_url).stores().results
    lock = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    handle = client.enqueue(Message(queue=unique, task="t.which_run", args=(str(log),),
                                    reply_to=f"{unique}-r"), keep_result=True)
    doomed = start_worker(broker_url, unique, burst=False)
    try:
        wait_event(client.broker, f"{unique}-r", "succeeded")  # reported, then storing
        doomed.kill()
        finish(doomed)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert store.get(handle.id) is None, "the killed worker stored nothing"
    out = finish(start_worker(broker_url, unique), timeout=90)
    first, second = (int(line) for line in log.read_text().split())
    assert handle.result(timeout=30) == second != first, out
    assert handle.status() == "succeeded"
