"""Redis-specific behaviour the conformance suite cannot see: reconnects, wake-ups, keys.

Every test uses its own key prefix and deletes its keys afterwards (SCAN + DEL on that
prefix only: the server is shared, so never FLUSHDB).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conveyor.broker import Depth
from conveyor.broker.redis import WAIT_CAP, RedisBroker, parse_url
from conveyor.errors import BrokerConnectionError, BrokerError, ConfigError, LeaseLost
from tests.conftest import REDIS_URL, opened_brokers, require_service
from tests.support import Proxy, first, wait_for

HOST, PORT = "127.0.0.1", 6379
MakeBroker = Callable[..., RedisBroker]


@pytest.fixture
def admin(unique: str) -> Iterator[redis.Redis]:
    """A plain client for inspecting the server; removes this test's keys at the end."""
    require_service("redis")
    client = redis.Redis(host=HOST, port=PORT, db=0)
    yield client
    for key in client.scan_iter(match=f"{unique}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def url(unique: str) -> str:
    return f"{REDIS_URL}?prefix={unique}"


@pytest.fixture
def make_broker(admin: redis.Redis, url: str) -> Iterator[MakeBroker]:
    with opened_brokers(url, RedisBroker) as make:
        yield make


@pytest.fixture
def queue(unique: str) -> str:
    return f"q-{unique}"


def connection(admin: redis.Redis, name: str, *, command: str | None = None,
               not_id: str = "", timeout: float = 5.0) -> dict[str, str]:
    """The server's CLIENT LIST entry named `name` (running `command`, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        for entry in admin.client_list():
            if (entry["name"] == name and command in (None, entry["cmd"])
                    and entry["id"] != not_id):
                return entry
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    raise AssertionError(f"no connection named {name!r} running {command!r} within {timeout} s")


def kill(admin: redis.Redis, name: str, *, command: str | None = None) -> str:
    """CLIENT KILL the connection named `name`, server side; return its id."""
    victim = connection(admin, name, command=command)["id"]
    assert admin.client_kill_filter(_id=victim) == 1
    return victim


def warnings_from_broker(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "conveyor.broker.redis" and r.levelno == logging.WARNING]


@pytest.fixture
def proxy(admin: redis.Redis) -> Iterator[Proxy]:
    relay = Proxy(HOST, PORT)
    yield relay
    relay.cut()


# -- connection loss ---------------------------------------------------------------------


def test_consumer_reconnects_after_its_blocked_connection_is_killed(
        make_broker: MakeBroker, admin: redis.Redis, queue: str,
        caplog: pytest.LogCaptureFixture) -> None:
    consumer, producer = make_broker(), make_broker()
    killed: list[str] = []

    def kill_then_publish() -> None:
        killed.append(kill(admin, consumer.connection_name, command="blpop"))
        # Publish only once the consumer is back in BLPOP on a new connection.
        connection(admin, consumer.connection_name, command="blpop", not_id=killed[0])
        producer.publish(queue, b"after the kill")

    chaos = threading.Thread(target=kill_then_publish)
    steps = consumer.consume([queue], timeout=20)
    chaos.start()
    delivery = next(steps)
    chaos.join()
    assert delivery is not None and delivery.body == b"after the kill"
    consumer.ack(delivery)
    connection(admin, consumer.connection_name, not_id=killed[0], timeout=0)
    assert any("waiting on queues" in m and "reconnecting" in m
               for m in warnings_from_broker(caplog))


def test_publisher_reconnects_after_its_connection_is_killed(
        make_broker: MakeBroker, admin: redis.Redis, queue: str,
        caplog: pytest.LogCaptureFixture) -> None:
    publisher = make_broker()
    publisher.publish(queue, b"before")
    killed = kill(admin, publisher.connection_name)
    publisher.publish(queue, b"after")
    connection(admin, publisher.connection_name, not_id=killed, timeout=0)
    assert any("publish" in m and "reconnecting" in m for m in warnings_from_broker(caplog))
    assert publisher.depth(queue) == Depth(2, 0, 0, 0)
    consumer = make_broker()
    got = []
    for delivery in consumer.consume([queue], timeout=0.5):
        if delivery is None:
            break
        got.append(delivery.body)
        consumer.ack(delivery)
    assert got == [b"before", b"after"]


def test_consumer_keeps_consuming_through_an_outage(
        proxy: Proxy, make_broker: MakeBroker, unique: str, queue: str,
        admin: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    consumer = make_broker(f"redis://{proxy.address}/0?prefix={unique}")
    producer = make_broker()

    def outage() -> None:
        connection(admin, consumer.connection_name, command="blpop")
        proxy.cut()
        time.sleep(1.0)  # Redis "down": the consumer backs off and retries
        producer.publish(queue, b"published during the outage")
        proxy.restore()

    chaos = threading.Thread(target=outage)
    steps = consumer.consume([queue], timeout=20)
    chaos.start()
    started = time.monotonic()
    delivery = next(steps)
    chaos.join()
    assert delivery is not None and delivery.body == b"published during the outage"
    assert time.monotonic() - started < 10
    consumer.ack(delivery)
    assert producer.depth(queue) == Depth(0, 0, 0, 0)
    retries = [m for m in warnings_from_broker(caplog) if "attempt" in m and "reconnecting in" in m]
    assert retries, "the consumer did not log its retries"


def test_publisher_gives_up_with_a_clear_error_after_retry_seconds(
        proxy: Proxy, make_broker: MakeBroker, unique: str, queue: str) -> None:
    publisher = make_broker(f"redis://{proxy.address}/0?prefix={unique}&retry_seconds=0.5")
    proxy.cut()
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match=r"publish to .* unreachable for 0.[5-9] s"):
        publisher.publish(queue, b"lost?")
    assert time.monotonic() - started < 20  # not the default 60 s (loaded machine: no less)
    proxy.restore()
    publisher.publish(queue, b"delivered")
    assert publisher.depth(queue).ready == 1


def test_wakeup_interrupts_a_consumer_retrying_through_an_outage(
        proxy: Proxy, make_broker: MakeBroker, unique: str, queue: str) -> None:
    consumer = make_broker(f"redis://{proxy.address}/0?prefix={unique}")
    proxy.cut()
    steps = consumer.consume([queue], timeout=60)
    timer = threading.Timer(0.5, consumer.wakeup)
    timer.start()
    started = time.monotonic()
    assert next(steps) is None
    assert time.monotonic() - started < 20  # woken, not after the 60 s timeout
    timer.join()


def test_pause_from_a_signal_handler_ends_a_blocked_step(make_broker: MakeBroker,
                                                         queue: str) -> None:
    """A worker pauses on SIGTERM: the handler runs on the thread blocked in BLPOP."""
    consumer, producer = make_broker(), make_broker()
    steps = consumer.consume([queue], timeout=60)
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: consumer.pause())
    try:
        timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGUSR1))
        started = time.monotonic()
        timer.start()
        assert next(steps) is None
        assert time.monotonic() - started < 20  # ended, not after the 60 s timeout
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    producer.publish(queue, b"not for a paused consumer")
    timer = threading.Timer(0.5, consumer.wakeup)
    timer.start()
    assert next(steps) is None  # paused: woken, yet it claims nothing
    timer.join()
    assert producer.depth(queue) == Depth(1, 0, 0, 0)


# -- blocking, not polling ---------------------------------------------------------------


def count_claims(broker: RedisBroker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap the broker's claim so the test can count how often it runs."""
    calls = [0]
    claim = broker._claim

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return claim(*args)

    monkeypatch.setattr(broker, "_claim", counted)
    return calls


def test_idle_consumer_blocks_instead_of_polling(make_broker: MakeBroker, queue: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = make_broker()
    claims = count_claims(consumer, monkeypatch)
    started = time.monotonic()
    assert next(consumer.consume([queue], timeout=2.0)) is None
    assert 1.9 < time.monotonic() - started < 10  # its timeout (a loaded machine: later)
    assert claims[0] <= 2, f"{claims[0]} claims in 2 s idle: the consumer polled"


def test_delayed_publish_rearms_a_waiting_consumer(make_broker: MakeBroker,
                                                   queue: str) -> None:
    consumer, producer = make_broker(), make_broker()
    steps = consumer.consume([queue], timeout=20)
    timer = threading.Timer(0.2, producer.publish, args=(queue, b"soon"), kwargs={"delay": 0.5})
    started = time.monotonic()
    timer.start()
    delivery = next(steps)
    waited = time.monotonic() - started
    timer.join()
    assert delivery is not None and delivery.body == b"soon"
    assert 0.65 <= waited < WAIT_CAP - 1, f"delivered after {waited:.2f} s"
    consumer.ack(delivery)


def test_expired_lease_is_rescued_when_due_not_on_a_poll(make_broker: MakeBroker,
                                                         queue: str) -> None:
    owner, rival = make_broker(lease_seconds=0.8), make_broker()
    owner.publish(queue, b"abandoned")
    held = first(owner, [queue])
    assert held is not None
    started = time.monotonic()
    again = next(rival.consume([queue], timeout=20))
    waited = time.monotonic() - started
    assert again is not None and again.delivery_count == 2
    assert waited < WAIT_CAP - 1, f"rescued after {waited:.2f} s: waited for the fallback"
    with pytest.raises(LeaseLost, match="no longer ours"):
        owner.ack(held)
    rival.ack(again)
    assert rival.depth(queue) == Depth(0, 0, 0, 0)


# -- leases and close --------------------------------------------------------------------


def test_close_gives_back_claimed_but_not_yet_yielded_deliveries(make_broker: MakeBroker,
                                                                 queue: str) -> None:
    consumer = make_broker()
    for i in range(4):
        consumer.publish(queue, str(i).encode())
    steps = consumer.consume([queue], prefetch=4, timeout=1)
    assert next(steps) is not None  # one claim took all four; three wait in the buffer
    consumer.close()
    other = make_broker()
    assert other.depth(queue) == Depth(4, 0, 0, 0)
    got = []
    for delivery in other.consume([queue], prefetch=4, timeout=0.5):
        if delivery is None:
            break
        got.append((delivery.body, delivery.delivery_count))
        other.ack(delivery)
    assert got == [(b"0", 2), (b"1", 2), (b"2", 2), (b"3", 2)]


def test_extend_lease_after_the_message_was_settled_raises_lease_lost(
        make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"x")
    delivery = first(broker, [queue])
    assert delivery is not None
    broker.ack(delivery)
    with pytest.raises(LeaseLost):
        broker.extend_lease(delivery)


def test_depth_counts_due_delayed_messages_as_ready(make_broker: MakeBroker,
                                                    queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"much later", delay=3600)  # not due for the whole test
    assert broker.depth(queue) == Depth(0, 0, 1, 0)
    broker.publish(queue, b"soon", delay=0.2)
    # Due after 0.2 s however slow the machine: wait for that, not for a fixed sleep.
    wait_for(lambda: broker.depth(queue) == Depth(1, 0, 1, 0), timeout=30,
             what="the due message to count as ready", detail=lambda: str(broker.depth(queue)))


# -- keys and options --------------------------------------------------------------------


def test_settled_work_leaves_no_keys_but_the_id_counter(make_broker: MakeBroker,
                                                        admin: redis.Redis, unique: str,
                                                        queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"a")
    broker.publish(queue, b"b", delay=0.1)
    assert {k.decode() for k in admin.scan_iter(match=f"{unique}:*")} == {
        f"{unique}:ids", f"{unique}:m:1", f"{unique}:m:2", f"{unique}:q:{queue}:ready",
        f"{unique}:q:{queue}:delayed", f"{unique}:q:{queue}:wake"}
    time.sleep(0.15)
    for delivery in broker.consume([queue], timeout=0.3):
        if delivery is None:
            break
        broker.ack(delivery)
    assert set(admin.scan_iter(match=f"{unique}:*")) == {f"{unique}:ids".encode()}


def test_wake_list_of_an_unconsumed_queue_stays_bounded(make_broker: MakeBroker,
                                                        admin: redis.Redis, unique: str,
                                                        queue: str) -> None:
    broker = make_broker()
    for _ in range(300):
        broker.publish(queue, b"x")
    wake = f"{unique}:q:{queue}:wake"
    assert admin.llen(wake) <= 128
    assert 0 < admin.ttl(wake) <= 60
    assert broker.purge(queue) == 300
    assert set(admin.scan_iter(match=f"{unique}:*")) == {f"{unique}:ids".encode()}


def test_priority_out_of_range_is_refused(make_broker: MakeBroker, queue: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        make_broker().publish(queue, b"x", priority=10_000)


def test_url_options() -> None:
    assert parse_url("redis://h:1/2") == ("redis://h:1/2", "conveyor", 60.0)
    assert parse_url("redis://h:1/2?prefix=p&socket_timeout=3&retry_seconds=5") == (
        "redis://h:1/2?socket_timeout=3", "p", 5.0)
    with pytest.raises(ConfigError, match="retry_seconds"):
        parse_url("redis://h:1/2?retry_seconds=soon")
    with pytest.raises(ConfigError, match="prefix"):
        parse_url("redis://h:1/2?prefix=")


def test_wrong_credentials_fail_at_once_with_a_clear_error(admin: redis.Redis,
                                                           unique: str) -> None:
    started = time.monotonic()
    with pytest.raises(BrokerError, match="refused this client.*fix the user, password"):
        RedisBroker(f"redis://nobody:wrong@{HOST}:{PORT}/0?prefix={unique}")
    assert time.monotonic() - started < 20, "bad credentials were retried (for 60 s)"


def test_scripts_are_loaded_again_when_the_server_forgot_them(make_broker: MakeBroker,
                                                               queue: str) -> None:
    broker = make_broker()
    broker._scripts["publish"].sha = "0" * 40  # as after a restart: NOSCRIPT
    broker.publish(queue, b"x")
    assert broker.depth(queue) == Depth(1, 0, 0, 0)
    assert broker._scripts["publish"].sha != "0" * 40


# -- ack_soon: the ack's answer travels with the next command -----------------------------


def test_ack_soon_is_answered_with_the_next_claim(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    for body in (b"a", b"b"):
        broker.publish(queue, body)
    steps = broker.consume([queue], prefetch=1, timeout=1)
    got = next(steps)
    assert got is not None and got.body == b"a"
    broker.ack_soon(got)
    assert broker.outstanding == 0  # the slot is free at once, the answer not yet read
    second = next(steps)  # this claim's round trip reads the ack's answer first
    assert second is not None and second.body == b"b"
    broker.ack_soon(second)
    assert broker.depth(queue) == Depth(0, 0, 0, 0)


def test_ack_soon_of_a_lost_lease_is_logged_not_raised(
        make_broker: MakeBroker, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    owner, rival = make_broker(lease_seconds=0.5), make_broker()
    owner.publish(queue, b"abandoned")
    held = first(owner, [queue])
    assert held is not None
    again = next(rival.consume([queue], timeout=20))
    assert again is not None
    owner.ack_soon(held)
    assert owner.depth(queue).active == 1  # the rival's claim is untouched
    assert any("no longer ours" in w for w in warnings_from_broker(caplog))
    rival.ack(again)
    assert rival.depth(queue) == Depth(0, 0, 0, 0)


def test_ack_soon_survives_a_dropped_connection(make_broker: MakeBroker, admin: redis.Redis,
                                                queue: str) -> None:
    """The connection dies with the ack's answer unread: the ack is sent again on the new
    connection and the message is gone, not redelivered when its lease expires."""
    broker = make_broker()
    broker.publish(queue, b"x")
    delivery = first(broker, [queue])
    assert delivery is not None
    broker.ack_soon(delivery)
    kill(admin, broker.connection_name)
    assert broker.depth(queue) == Depth(0, 0, 0, 0)


def test_close_reads_the_answers_of_acks_sent_ahead(make_broker: MakeBroker,
                                                    queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"x")
    delivery = first(broker, [queue])
    assert delivery is not None
    broker.ack_soon(delivery)
    broker.close()
    assert make_broker().depth(queue) == Depth(0, 0, 0, 0)
