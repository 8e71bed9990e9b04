"""What is specific to the kombu transport: its URL, its named limits, its delay levels.

The conformance suite (`test_contract.py`) runs it as `kombu+redis` and `kombu+amqp`; this
module covers only what the suite cannot: the options, the one line `conveyor worker`
prints about weaker guarantees, and delays long enough to walk down the levels.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import Depth, from_url
from conveyor.broker.kombu import (
    KombuBroker,
    describe_limits,
    kombu_priority,
    level_floor,
    level_of,
    parse_url,
)
from conveyor.client import Client
from conveyor.errors import BrokerConnectionError, BrokerError, ConfigError, LeaseLost
from conveyor.message import Message
from tests.conftest import RABBITMQ_URL, REDIS_URL, delete_redis_prefix, require_service
from tests.contract.conftest import delete_rabbitmq_queues
from tests.integration.workerkit import worker_env
from tests.support import first

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(("seconds", "level"), [
    (0.1, 0), (1.99, 0), (2.0, 1), (3.9, 1), (4.0, 2), (1000.0, 9), (10**9, 16)])
def test_delay_levels_hold_powers_of_two(seconds: float, level: int) -> None:
    assert level_of(seconds) == level
    assert level_floor(level) <= seconds


def test_url_options_become_kombu_transport_options() -> None:
    redis = parse_url("kombu+redis://127.0.0.1:6379/0?prefix=app:&visibility_timeout=60")
    assert (redis.url, redis.prefix) == ("redis://127.0.0.1:6379/0", "")
    assert redis.transport_options == {"visibility_timeout": 60.0, "global_keyprefix": "app:"}
    amqp = parse_url("kombu+amqp://guest:guest@host//?prefix=app.&heartbeat=10")
    assert (amqp.url, amqp.prefix) == ("amqp://guest:guest@host//?heartbeat=10", "app.")
    assert amqp.transport_options == {"confirm_publish": True}
    assert parse_url("kombu+amqp://h//?queue_expires=600").queue_arguments == {
        "x-expires": 600_000}


@pytest.mark.parametrize("url", ["kombu://x", "redis+kombu://x",
                                 "kombu+redis://h/0?visibility_timeout=soon"])
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        parse_url(url)


@pytest.fixture(params=["kombu+redis", "kombu+amqp"])
def kombu_url(request: pytest.FixtureRequest, unique: str) -> Iterator[str]:
    if request.param == "kombu+redis":
        require_service("redis")
        yield f"kombu+{REDIS_URL}?prefix={unique}:"
        delete_redis_prefix(unique)
    else:
        require_service("rabbitmq")
        yield f"kombu+{RABBITMQ_URL}?prefix={unique}."
        delete_rabbitmq_queues(unique + ".")


def test_limits_are_named_not_hidden(kombu_url: str) -> None:
    broker = from_url(kombu_url)
    try:
        assert isinstance(broker, KombuBroker) and broker.supports_priority
        line = broker.weaker_guarantees
        assert "\n" not in line and "priorities in four bands" in line and "delays" in line
        if kombu_url.startswith("kombu+redis"):
            assert "visibility timeout" in line and "crash_redelivery" in broker.unsupported
        else:
            assert "return at once" in line and not broker.unsupported
    finally:
        broker.close()


def test_a_long_delay_walks_down_the_levels_and_is_never_early(kombu_url: str,
                                                               unique: str) -> None:
    broker = from_url(kombu_url)
    queue = f"walk-{unique}"
    try:
        published = time.time()
        broker.publish(queue, b"later", delay=4.5)  # level 2, then 1, then 0, then ready
        assert broker.depth(queue).delayed == 1
        got = None
        for delivery in broker.consume([queue], timeout=0.5):
            if delivery is not None or time.time() - published > 15:
                got = delivery
                break
        assert got is not None and got.body == b"later"
        waited = time.time() - published
        assert 4.5 <= waited < 4.5 / 2 + 1 + 4.5 + 1, waited
        broker.ack(got)
        assert broker.depth(queue).delayed == 0
    finally:
        broker.close()


def test_conveyor_worker_on_kombu_says_what_it_cannot_keep(kombu_url: str,
                                                           unique: str) -> None:
    """A real worker drains a kombu queue, and its first lines name the weaker guarantees."""
    queue = f"w-{unique}"
    with from_url(kombu_url) as broker:
        Client(broker).enqueue(Message(queue=queue, task="t.add", args=(2, 3)))
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "worker", f"--queues={queue}", "--burst",
         "--app=tests.integration.worker_tasks", "--heartbeat-interval=1"],
        cwd=ROOT, env=worker_env(kombu_url), capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stderr.splitlines() if "weaker guarantees" in x]
    assert "kombu+" in line and "priorities in four bands" in line
    assert "task=t.add" in done.stderr and "succeeded" in done.stderr


def test_an_idle_or_full_consumer_blocks_instead_of_spinning(kombu_url: str,
                                                             unique: str) -> None:
    """Delay levels are polled, but between looks the consumer sleeps in the broker."""
    broker = from_url(kombu_url)
    queue = f"idle-{unique}"
    try:
        broker.publish(queue, b"held")
        steps = broker.consume([queue], prefetch=1, timeout=2.0)
        held = next(steps)
        assert held is not None
        started, cpu = time.monotonic(), time.process_time()
        assert steps.send(2.0) is None  # full: nothing more may be handed out
        broker.ack(held)
        assert steps.send(2.0) is None  # idle
        assert time.monotonic() - started >= 3.5
        assert time.process_time() - cpu < 0.5, "the consumer spun instead of blocking"
    finally:
        broker.close()


def test_an_unreachable_broker_is_one_clear_error() -> None:
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError,
                       match=r"stayed unreachable for [0-9.]+ s .*retry_seconds=1"):
        from_url("kombu+redis://127.0.0.1:1/0?retry_seconds=1")
    assert time.monotonic() - started < 10


def test_a_lost_connection_is_survived_and_held_deliveries_come_back(unique: str) -> None:
    """The socket is cut under a consumer holding a delivery (a fabricated network loss):
    settling it says LeaseLost, and the next steps reconnect and get it again."""
    require_service("rabbitmq")
    url = f"kombu+{RABBITMQ_URL}?prefix={unique}."
    queue = f"loss-{unique}"
    broker = from_url(url)
    try:
        broker.publish(queue, b"survivor")
        steps = broker.consume([queue], timeout=0.5)
        held = next(steps)
        assert held is not None and held.delivery_count == 1
        assert isinstance(broker, KombuBroker) and broker._conn is not None
        broker._conn.connection.sock.shutdown(socket.SHUT_RDWR)
        again = next((d for d in (steps.send(0.5) for _ in range(20)) if d is not None), None)
        assert again is not None and again.body == b"survivor" and again.delivery_count == 2
        with pytest.raises(LeaseLost):
            broker.ack(held)
        broker.ack(again)
        assert broker.depth(queue) == Depth(0, 0, 0, 0)
    finally:
        broker.close()
        delete_rabbitmq_queues(unique + ".")


def test_a_dropped_consume_loop_gives_back_what_it_buffered(kombu_url: str,
                                                            unique: str) -> None:
    """kombu pushes messages ahead (prefetch): a loop the caller drops must not sit on
    them, and the delivery it handed out stays settleable."""
    owner, other = from_url(kombu_url), from_url(kombu_url)
    queue = f"drop-{unique}"
    try:
        for i in range(4):
            owner.publish(queue, str(i).encode())
        steps = owner.consume([queue], prefetch=4, timeout=0.5)
        held = next(steps)
        assert held is not None
        del steps  # the caller stops consuming
        rest = []
        for delivery in other.consume([queue], prefetch=4, timeout=1.0):
            if delivery is None:
                break
            rest.append(delivery.body)
            other.ack(delivery)
        assert sorted(rest) == sorted({b"0", b"1", b"2", b"3"} - {held.body})
        owner.ack(held)
        assert owner.depth(queue) == Depth(0, 0, 0, 0)
    finally:
        owner.close()
        other.close()


def test_priorities_become_kombus_own_per_transport() -> None:
    """Redis: kombu pops its priority 0 first, so band 3 is 0 and band 0 is 9; AMQP: the
    band itself (x-max-priority 3); elsewhere kombu has none."""
    assert [kombu_priority("redis", p) for p in (0, 2, 5, 9)] == [9, 6, 3, 0]
    assert [kombu_priority("amqp", p) for p in (0, 2, 5, 9)] == [0, 1, 2, 3]
    assert kombu_priority("sqs", 9) is None
    assert "priorities are ignored" in describe_limits("sqs", 30)


def test_a_priority_keeps_its_band_through_a_delay_and_a_retry(kombu_url: str,
                                                                unique: str) -> None:
    broker = from_url(kombu_url)
    queue = f"pri-{unique}"
    try:
        broker.publish(queue, b"high", priority=8, delay=0.5)
        got = first(broker, [queue], timeout=10)
        assert got is not None and (got.body, got.priority) == (b"high", 8)
        broker.publish(queue, b"low")
        broker.retry_later(got, 0.0)  # published after "low", in a higher band
        again = first(broker, [queue], timeout=5)
        assert again is not None and (again.body, again.priority) == (b"high", 8)
        broker.ack(again)
        low = first(broker, [queue], timeout=10)
        assert low is not None and (low.body, low.priority) == (b"low", 0)
        broker.ack(low)
    finally:
        broker.close()


def test_an_amqp_queue_made_without_priorities_is_refused_saying_what_to_do(
        unique: str) -> None:
    """A kombu+amqp queue an earlier version declared without x-max-priority cannot be
    declared with it: the error says so and what to do, instead of only RabbitMQ's 406."""
    require_service("rabbitmq")
    import pika
    name = f"{unique}.old"
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        connection.channel().queue_declare(name, durable=True)
        broker = from_url(f"kombu+{RABBITMQ_URL}?retry_seconds=1")
        try:
            with pytest.raises(BrokerError, match="x-max-priority 3 .* drain and delete"):
                broker.publish(name, b"x")
        finally:
            broker.close()
    finally:
        connection.close()
        delete_rabbitmq_queues(unique + ".")


def test_a_code_versions_amqp_queue_is_declared_to_expire(unique: str) -> None:
    """`<queue>@<version>` on kombu+amqp gets x-expires, as on the rabbitmq broker: declared
    again with another expiry, RabbitMQ refuses (406), which shows what it holds."""
    require_service("rabbitmq")
    import pika
    name = f"{unique}.q@v1"
    broker = from_url(f"kombu+{RABBITMQ_URL}?retry_seconds=1")
    try:
        broker.publish(name, b"x")
    finally:
        broker.close()
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-expires"):
            connection.channel().queue_declare(name, durable=True, arguments={
                "x-max-priority": 3, "x-expires": 1})
    finally:
        if connection.is_open:
            connection.close()
        delete_rabbitmq_queues(unique + ".")
