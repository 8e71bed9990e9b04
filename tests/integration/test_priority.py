"""Priorities through a real worker on RabbitMQ (issue 29): quorum queues have none, so
Conveyor keeps them in band queues (`conveyor.broker.rabbitmq.bands`). A worker part way
through a backlog of low-priority tasks starts 10 high-priority ones before any low task
it had not already read ahead (concurrency + read-ahead: 1 + 8)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import Broker
from conveyor.client import Client
from tests.conftest import RABBITMQ_URL, clean_transport, require_service
from tests.integration.workerkit import finish, open_broker, start_worker, stop, task_message
from tests.support import wait_for

LOWS, HIGHS, READ_AHEAD = 1000, 10, 8


@pytest.fixture
def broker(unique: str) -> Iterator[Broker]:
    require_service("rabbitmq")
    b = open_broker(RABBITMQ_URL)
    yield b
    b.close()
    clean_transport("rabbitmq", unique)


def started(path: Path) -> list[str]:
    """The tokens of the tasks that started, in order (t.record appends 'start TOKEN PID')."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.split()[1] for line in lines if line.startswith("start ")]


def test_a_worker_starts_high_priority_tasks_before_a_low_backlog(
        broker: Broker, unique: str, tmp_path: Path) -> None:
    log = tmp_path / "order"
    client = Client(broker)
    broker.publish_many([client.publication(task_message("t.record", unique, str(log), f"low{i}"))
                         for i in range(LOWS)])
    worker = start_worker(RABBITMQ_URL, unique, "-c", "1", f"--read-ahead={READ_AHEAD}",
                          "--drain-timeout=0", burst=False)
    try:
        wait_for(lambda: len(started(log)) >= 5, 90, "the worker to start low tasks")
        broker.publish_many([client.publication(task_message(
            "t.record", unique, str(log), f"high{i}", priority=9)) for i in range(HIGHS)])
        # Counted once the highs are on the queue: lows started while they were being
        # published were not yet behind them (CI once saw 10 start during the publish).
        already = {t for t in started(log) if t.startswith("low")}
        wait_for(lambda: sum(t.startswith("high") for t in started(log)) == HIGHS, 90,
                 "the high-priority tasks to start")
    finally:
        stop(worker, signal.SIGTERM)
        out = finish(worker, 60)
    order = [t for t in started(log) if t not in already]
    last_high = max(i for i, t in enumerate(order) if t.startswith("high"))
    lows = [t for t in order[:last_high] if t.startswith("low")]
    assert len(lows) <= 1 + READ_AHEAD, f"{len(lows)} low tasks started first: {order}\n{out}"
    assert [t for t in order if t.startswith("high")] == [f"high{i}" for i in range(HIGHS)]
