"""`--read-ahead` on RabbitMQ: a busy worker may hold deliveries beyond its slots (8 by
default; 1 here), or none, so that a waiting message stays on the queue for an idle worker
(long tasks)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import Broker
from tests.conftest import RABBITMQ_URL, clean_transport, require_service
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
