"""Once per key on every transport: producers racing for the same keys publish each once.

The keys are held in flow control's store (`locations.store_urls`): the broker's own for SQLite,
Redis and Postgres; the state store (here a SQLite file) for RabbitMQ and kombu.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from conveyor.broker import Broker
from conveyor.flow import UNIQUE_HEADER
from conveyor.locations import store_urls
from conveyor.message import Codec
from tests.contract.conftest import ENV
from tests.support import first

MakeBroker = Callable[..., Broker]
PRODUCERS = 8
KEYS = 1000
PRODUCER = str(Path(__file__).with_name("unique_producer.py"))

pytestmark = pytest.mark.slow


def test_producers_racing_for_the_same_keys_publish_each_key_once(
        make_broker: MakeBroker, broker_url: str, queue: str, tmp_path: Path,
        processes: list[subprocess.Popen[bytes]]) -> None:
    store = store_urls(broker_url, f"sqlite:///{tmp_path}/state.db").limits
    broker = make_broker()
    warm_up(broker, queue)
    for _ in range(PRODUCERS):
        processes.append(subprocess.Popen(
            [sys.executable, PRODUCER, broker_url, store, queue, str(KEYS)], env=ENV,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    for proc in processes:  # every producer has its connections open: then all go at once
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    for proc in processes:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
    handles: dict[int, list[tuple[str, bool]]] = defaultdict(list)
    for proc in processes:
        assert proc.stdout is not None
        out = proc.stdout.read()  # pytest's timeout bounds this
        assert proc.wait(timeout=60) == 0
        for i, message_id, duplicate in json.loads(out):
            handles[i].append((message_id, duplicate))
    winners = {}
    for i, seen in handles.items():
        assert len({message_id for message_id, _ in seen}) == 1, f"key k{i}: {seen}"
        assert sum(not duplicate for _, duplicate in seen) == 1, f"key k{i}: {seen}"
        winners[seen[0][0]] = f"k{i}"
    assert len(winners) == KEYS
    assert drained(broker, queue) == winners


def warm_up(broker: Broker, queue: str) -> None:
    """Create the queue before the race: eight first publications declaring one new RabbitMQ
    quorum queue at once can have one of them refused (basic.nack) while its leader starts,
    which is the broker's first-declaration race, not what this test is about."""
    broker.publish(queue, b"warm-up")
    delivery = first(broker, [queue], timeout=10)
    assert delivery is not None and delivery.body == b"warm-up"
    broker.ack(delivery)


def drained(broker: Broker, queue: str) -> dict[str, str]:
    """Every message on `queue` (acked): id -> its unique key header."""
    codec, out = Codec(), {}
    for delivery in broker.consume([queue], prefetch=200, timeout=2.0):
        if delivery is None:
            break
        message = codec.decode(delivery.body)
        assert message.id not in out, f"{message.id} delivered twice"
        out[message.id] = message.headers[UNIQUE_HEADER]
        broker.ack(delivery)
    return out
