"""`--read-ahead`: on RabbitMQ a busy worker may hold deliveries beyond its slots (8 by
default; 1 here), or none, so that a waiting message stays on the queue for an idle worker
(long tasks). On Postgres a worker running short tasks claims that many more in one claim
and acks them with its next claims; one running a long task holds nothing back, one
draining gives back at once what it read ahead, and one SIGKILLed with a batch claimed and
acks owed loses nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import Broker
from conveyor.client import Client
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, clean_transport, require_service
from tests.integration.workerkit import (
    enqueue,
    finish,
    open_broker,
    start_worker,
    stop,
    task_message,
)
from tests.support import wait_for


@pytest.fixture
def broker(unique: str) -> Iterator[Broker]:
    require_service("rabbitmq")
    b = open_broker(RABBITMQ_URL)
    yield b
    b.close()
    clean_transport("rabbitmq", unique)


@pytest.mark.parametrize("read_ahead, ready", [("1", 0), ("0", 1)])
def test_a_busy_worker_holds_one_more_delivery_only_when_reading_ahead(
        broker: Broker, unique: str, tmp_path: Path, read_ahead: str, ready: int) -> None:
    marker = tmp_path / "started"
    enqueue(broker, task_message("t.sleep", unique, 30, str(marker)))
    worker = start_worker(RABBITMQ_URL, unique, "-c", "1", f"--read-ahead={read_ahead}",
                          "--drain-timeout=0", burst=False)
    try:
        wait_for(marker.exists, 60, "the long task to start")
        enqueue(broker, task_message("t.noop", unique))
        # the second message is pushed to the busy worker (ready 0) or stays for another
        depth = wait_for(lambda: (d := broker.depth(unique)).in_flight == 2 - ready
                         and d.ready == ready and d, 30,
                         f"{ready} ready and the rest in flight with --read-ahead={read_ahead}")
        assert depth.ready == ready
    finally:
        stop(worker, signal.SIGKILL)
        finish(worker, 30)


@pytest.fixture
def postgres(unique: str) -> Iterator[tuple[str, Broker]]:
    require_service("postgres")
    url = f"{POSTGRES_URL}?schema={unique}"
    b = open_broker(url)
    yield url, b
    b.close()
    clean_transport("postgres", unique)


def test_a_postgres_worker_busy_with_a_long_task_holds_nothing_back(
        postgres: tuple[str, Broker], unique: str, tmp_path: Path) -> None:
    url, broker = postgres
    marker = tmp_path / "started"
    enqueue(broker, task_message("t.sleep", unique, 30, str(marker)))
    worker = start_worker(url, unique, "-c", "1", "--read-ahead=8", "--drain-timeout=0",
                          burst=False)
    try:
        wait_for(marker.exists, 60, "the long task to start")
        enqueue(broker, task_message("t.noop", unique))
        time.sleep(1.5)  # a heartbeat and more: nothing claims it meanwhile
        depth = broker.depth(unique)
        assert (depth.ready, depth.in_flight) == (1, 1)
    finally:
        stop(worker, signal.SIGKILL)
        finish(worker, 30)


def test_a_postgres_worker_killed_with_a_batch_claimed_and_acks_owed_loses_nothing(
        postgres: tuple[str, Broker], unique: str, tmp_path: Path) -> None:
    """SIGKILL once it holds more than its 2 slots (a batch read ahead); a second worker
    runs what the first claimed but did not ack once the leases lapse (3 s)."""
    url, broker = postgres
    log, client, n = tmp_path / "ran", Client(broker), 300
    broker.publish_many([client.publication(task_message("t.record", unique, str(log), f"m{i}"))
                         for i in range(n)])
    worker = start_worker(url, unique, "-c", "2", "--max-tasks-per-child=100", burst=False)
    try:
        wait_for(lambda: broker.depth(unique).in_flight > 2, 60,
                 "the worker to claim beyond its 2 slots")
    finally:
        stop(worker, signal.SIGKILL)
        first = finish(worker, 30)
    assert done(log) and len(done(log)) < n, first  # killed part way
    rescuer = start_worker(url, unique, "-c", "2", "--max-tasks-per-child=100")
    out = finish(rescuer, 120)
    assert done(log) == {f"m{i}" for i in range(n)}, out
    assert broker.depth(unique).active == 0


def done(log: Path) -> set[str]:
    """Tokens of the t.record runs that finished."""
    lines = log.read_text().splitlines() if log.exists() else []
    return {line.split()[1] for line in lines if line.startswith("done ")}


def test_a_draining_postgres_worker_gives_back_what_it_read_ahead_at_once(
        postgres: tuple[str, Broker], unique: str, tmp_path: Path) -> None:
    """Short tasks, then a long one, then short ones: once the long one runs, the worker
    holds a batch read ahead behind it; SIGTERM makes them ready while it still runs (it
    runs until the test releases it: an 8 s one could end first on a loaded machine)."""
    url, broker = postgres
    log, marker, client = tmp_path / "ran", tmp_path / "long", Client(broker)
    release = tmp_path / "release"
    shorts = [task_message("t.record", unique, str(log), f"m{i}") for i in range(40)]
    broker.publish_many([client.publication(m) for m in [
        *shorts[:20], task_message("t.wait_for_file", unique, str(marker), str(release)),
        *shorts[20:]]])
    worker = start_worker(url, unique, "-c", "1", "--max-tasks-per-child=100", burst=False)
    try:
        wait_for(marker.exists, 60, "the long task to start")
        time.sleep(0.5)  # the acks owed of the tasks before it are due, and sent, by then
        assert broker.depth(unique).in_flight > 1, "nothing was read ahead of the long task"
        stop(worker, signal.SIGTERM)
        wait_for(lambda: broker.depth(unique).in_flight == 1, 30,
                 "what was read ahead to be ready again while the long task runs")
        assert worker.poll() is None  # still draining: the long task runs
    finally:
        release.touch()
        stop(worker, signal.SIGKILL)
        finish(worker, 30)
