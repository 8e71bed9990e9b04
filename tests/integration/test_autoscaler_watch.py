"""`Broker.watch` on every transport: how an autoscaler at zero learns of new work.

It must return as soon as work is there (at once if it already is), respect the activation
threshold (`above`), stop on `wakeup()`, and never take a message or a wake-up from a
consumer waiting on the same queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.autoscaler.watch import ZeroWatch
from conveyor.broker import Broker, from_url
from tests.conftest import clean_transport, require_service
from tests.contract.conftest import ENABLED, TRANSPORTS
from tests.support import wait_for

BODY = b'{"v":1}'


@pytest.fixture(params=ENABLED)
def open_broker(request: pytest.FixtureRequest, tmp_path: Path,
                unique: str) -> Iterator[Callable[[], Broker]]:
    """Open brokers on a fresh URL of the transport; all closed (and cleaned) at the end."""
    service, make_url = TRANSPORTS[request.param]
    if service:
        require_service(service)
    url = make_url(tmp_path, unique)
    opened: list[Broker] = []

    def make() -> Broker:
        opened.append(from_url(url))
        return opened[-1]

    yield make
    for broker in opened:
        broker.close()
    clean_transport(request.param, unique)


@pytest.fixture
def q(unique: str) -> Iterator[str]:
    yield f"watch-{unique}"


def publish_later(broker: Broker, queue: str, delay: float) -> threading.Thread:
    def publish() -> None:
        time.sleep(delay)
        broker.publish(queue, BODY)
    thread = threading.Thread(target=publish)
    thread.start()
    return thread


def test_true_at_once_when_work_is_ready(open_broker: Callable[[], Broker], q: str) -> None:
    publisher, watcher = open_broker(), open_broker()
    publisher.publish(q, BODY)
    started = time.monotonic()
    assert watcher.watch([q], timeout=60)
    # at once, not after the 60 s timeout (a bound far from both: the machine may be loaded)
    assert time.monotonic() - started < 20
    assert publisher.depth(q).ready == 1, "watching must not claim"


def test_false_after_timeout_on_an_empty_queue(open_broker: Callable[[], Broker],
                                               q: str) -> None:
    watcher = open_broker()
    started = time.monotonic()
    assert not watcher.watch([q], timeout=0.5)
    assert 0.45 < time.monotonic() - started < 10  # its timeout, not hung (loaded machine)


def test_a_publish_wakes_it_within_a_poll(open_broker: Callable[[], Broker], q: str) -> None:
    publisher, watcher = open_broker(), open_broker()
    watcher.watch([q], timeout=0.01)  # listeners set up: the publish below is news
    thread = publish_later(publisher, q, 0.3)
    started = time.monotonic()
    assert watcher.watch(["other-" + q, q], timeout=60)
    thread.join()
    # woken by the publish, not by the 60 s timeout (a bound, not a speed target: the
    # machine may be loaded; the autoscaler benchmark measures the real wake-up time)
    assert time.monotonic() - started < 20


def test_waits_for_more_than_above(open_broker: Callable[[], Broker], q: str) -> None:
    publisher, watcher = open_broker(), open_broker()
    publisher.publish(q, BODY)
    publisher.publish(q, BODY)
    assert not watcher.watch([q], timeout=0.4, above=2)
    thread = publish_later(publisher, q, 0.2)
    assert watcher.watch([q], timeout=10, above=2)
    thread.join()


def test_wakeup_ends_it(open_broker: Callable[[], Broker], q: str) -> None:
    watcher = open_broker()
    timer = threading.Timer(0.3, watcher.wakeup)
    timer.start()
    started = time.monotonic()
    assert not watcher.watch([q], timeout=60)
    assert time.monotonic() - started < 20  # woken, not after the 60 s timeout
    timer.join()


def test_takes_nothing_from_a_waiting_consumer(open_broker: Callable[[], Broker],
                                               q: str) -> None:
    """A consumer blocked on the queue still gets the message at once while a watcher
    watches: the watcher must not consume its wake-up (Redis: never BLPOP the wake list)."""
    publisher, watcher, consumer = open_broker(), open_broker(), open_broker()
    steps = consumer.consume([q], prefetch=1, timeout=0.05)
    assert next(steps) is None  # subscribed and waiting
    watching = threading.Thread(target=watcher.watch, args=([q], 1.0))
    watching.start()
    time.sleep(0.2)
    publisher.publish(q, BODY)
    started = time.monotonic()
    delivery = steps.send(5.0)
    waited = time.monotonic() - started
    assert delivery is not None and delivery.body == BODY
    consumer.ack(delivery)
    # On RabbitMQ a watch beside another connection's consumer may wait up to 20 s for the
    # management statistics (and raise if none come): the thread must not outlive the test,
    # or what it raises fails whichever test runs next.
    watching.join(timeout=60)
    assert not watching.is_alive(), "the watch outlived its 1 s timeout by a minute"
    assert waited < 1.0
    steps.close()


def test_zero_watch_pokes_on_work_and_holds_no_broker_away_from_zero(tmp_path: Path,
                                                                     q: str) -> None:
    """The daemon's side: a broker is open only while the target is at zero."""
    url = f"sqlite:///{tmp_path}/broker.db"
    opened: list[Broker] = []
    poked = threading.Event()

    def open_broker() -> Broker:
        opened.append(from_url(url))
        return opened[-1]

    watch = ZeroWatch("t", [q], 0, open_broker, poked.set)
    watch.start()
    publisher = from_url(url)
    try:
        time.sleep(0.2)
        assert not opened, "not at zero yet: nothing to watch"
        watch.at_zero(True)
        wait_for(lambda: opened, 30, "the watch to open its broker at zero")
        publisher.publish(q, BODY)
        assert poked.wait(30), "new work at zero pokes the daemon"
        wait_for(lambda: watch._broker is None, 30, "left zero: the broker is closed")
        assert len(opened) == 1
        watch.at_zero(True)  # back at zero with the message still there: pokes again
        poked.clear()
        assert poked.wait(30)
    finally:
        watch.stop()
        publisher.close()
    assert watch.failure is None
