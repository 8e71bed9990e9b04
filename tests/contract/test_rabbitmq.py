"""RabbitMQ-specific behaviour the conformance suite cannot see.

Server-side connection loss and re-subscription, the delay ladder's timing, dead-letter
headers, RabbitMQ's own delivery-limit backstop, and depth without the management plugin;
plus the pure parts (the ladder's routing keys, ack coalescing) without a server. Every
queue a test creates is deleted afterwards, with its dead-letter queue and delay levels.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

import pika
import pytest

from conveyor.broker import Delivery, Depth, Publication
from conveyor.broker.bands import band_of
from conveyor.broker.rabbitmq import (
    DELAY_LEVELS,
    DELAY_UNIT_MS,
    AckLedger,
    ManagementAPI,
    RabbitMQBroker,
    delay_key,
    delay_units,
    destination_token,
    level_pattern,
    set_levels,
)
from conveyor.broker.rabbitmq.bands import band_queue, bands_high_first, even_units
from conveyor.errors import BrokerError, LeaseLost
from tests.conftest import RABBITMQ_URL, delete_rabbitmq_queues, require_service
from tests.support import first, wait_for

LOGGER = "conveyor.broker.rabbitmq"


@pytest.fixture
def rabbit() -> None:
    require_service("rabbitmq")


@pytest.fixture
def queue(rabbit: None, unique: str) -> Iterator[str]:
    """A unique queue; it and its `.dead` and `.delay.<k>` queues are deleted at the end."""
    name = f"q-{unique}"
    yield name
    api = ManagementAPI("http://127.0.0.1:15672", "guest", "guest", "/")
    family = api.queue_family(name) | api.queue_family(name + "-b")
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = connection.channel()
        for member in family:
            channel.queue_delete(member)
    finally:
        connection.close()


@pytest.fixture
def open_broker(queue: str) -> Iterator[Callable[..., RabbitMQBroker]]:
    """Open RabbitMQ brokers (URL options as keywords); all are closed at the end, before
    the test's queues are deleted."""
    opened: list[RabbitMQBroker] = []

    def make(lease_seconds: float = 60.0, **options: str) -> RabbitMQBroker:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        broker = RabbitMQBroker(RABBITMQ_URL + (f"?{query}" if query else ""), lease_seconds)
        opened.append(broker)
        return broker

    yield make
    for broker in opened:
        broker.close()


# -- connection loss ------------------------------------------------------------------------


def close_connection_server_side(connection_name: str) -> None:
    """`rabbitmqctl close_connection` on the connection whose client named itself so."""
    listed = subprocess.run(["rabbitmqctl", "-q", "--no-table-headers", "list_connections",
                             "pid", "client_properties"],
                            capture_output=True, text=True, check=True, timeout=60)
    for line in listed.stdout.splitlines():
        pid, _, props = line.partition("\t")
        if f'{{"connection_name","{connection_name}"}}' in props:
            subprocess.run(["rabbitmqctl", "-q", "close_connection", pid,
                            "conveyor test: simulated connection loss"],
                           capture_output=True, check=True, timeout=60)
            return
    raise AssertionError(f"no RabbitMQ connection named {connection_name!r}")


def test_consumer_reconnects_and_receives_what_is_published_after(
        open_broker: Callable[..., RabbitMQBroker], queue: str,
        caplog: pytest.LogCaptureFixture) -> None:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed here")
    consumer, producer = open_broker(), open_broker()
    producer.publish(queue, b"before")
    steps = consumer.consume([queue], prefetch=2, timeout=0.2)
    held = next(steps)
    assert held is not None and held.body == b"before"

    caplog.set_level(logging.WARNING, logger=LOGGER)
    close_connection_server_side(consumer.connection_name)
    producer.publish(queue, b"after")
    got: dict[bytes, int] = {}
    deadline = time.monotonic() + 30
    while set(got) != {b"before", b"after"} and time.monotonic() < deadline:
        delivery = next(steps)
        if delivery is not None:
            got[delivery.body] = delivery.delivery_count
            consumer.ack(delivery)

    assert got == {b"before": 2, b"after": 1}, "no re-subscription after the connection loss"
    with pytest.raises(LeaseLost):
        consumer.ack(held)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("lost" in w and "reconnecting" in w for w in warnings), warnings
    assert any("re-subscribed" in w for w in warnings), warnings


# -- the delay ladder -------------------------------------------------------------------------


def test_delays_are_never_early_and_at_most_about_a_second_late(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    broker = open_broker()
    delays = {b"0.5": 0.5, b"1": 1.0, b"3": 3.0, b"0.1": 0.1, b"1.3": 1.3}
    published: dict[bytes, float] = {}
    for body, delay in delays.items():
        published[body] = time.monotonic()
        broker.publish(queue, body, delay=delay)
    assert broker.depth(queue).delayed == len(delays)
    arrived: dict[bytes, float] = {}
    deadline = time.monotonic() + 15
    for delivery in broker.consume([queue], prefetch=8, timeout=0.2):
        if delivery is not None:
            arrived[delivery.body] = time.monotonic()
            broker.ack(delivery)
        if len(arrived) == len(delays) or time.monotonic() > deadline:
            break
    late = {body: arrived[body] - published[body] - delays[body] for body in arrived}
    assert set(late) == set(delays), f"never delivered: {set(delays) - set(late)}"
    assert all(v >= 0 for v in late.values()), f"delivered early: {late}"
    # the ladder's granularity makes it up to ~0.25 s late; the rest is a loaded machine's
    assert all(v <= 2.5 for v in late.values()), f"delivered late: {late}"
    assert broker.depth(queue).delayed == 0


def test_retry_later_with_a_delay_walks_the_ladder_and_keeps_counting(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    broker = open_broker()
    broker.publish(queue, b"job")
    delivery = first(broker, [queue])
    assert delivery is not None
    started = time.monotonic()
    broker.retry_later(delivery, delay=0.75, body=b"job-2")
    assert broker.depth(queue).delayed == 1
    again = first(broker, [queue], timeout=10)
    assert again is not None and (again.body, again.delivery_count) == (b"job-2", 2)
    assert time.monotonic() - started >= 0.75
    broker.ack(again)


def walk(units: int, queue: str) -> tuple[list[int], str]:
    """Route a delayed message through the ladder's bindings as RabbitMQ's topic exchanges
    would: (levels it waits in, highest first; where it ends)."""
    key = delay_key(units, queue).split(".")

    def matches(pattern: str) -> bool:
        words = pattern.split(".")
        return len(words) == len(key) and all(w in ("*", k) for w, k in zip(words, key,
                                                                             strict=True))

    waited: list[int] = []
    for level in range(units.bit_length() - 1, -1, -1):
        if matches(level_pattern(level, "1", destination_token(queue))):
            waited.append(level)
        else:
            assert matches(level_pattern(level, "0", "*"))
    return waited, queue if matches(level_pattern(0, "0", destination_token(queue))) or \
        waited[-1:] == [0] else "nowhere"


@pytest.mark.parametrize("delay", [0.01, 0.25, 0.5, 1.0, 1.5, 3.0, 60.0, 86400.0, 3e6])
def test_the_ladder_waits_the_rounded_up_delay_exactly(delay: float) -> None:
    units = delay_units(delay)
    assert units * DELAY_UNIT_MS / 1000 >= delay > (units - 1) * DELAY_UNIT_MS / 1000
    waited, destination = walk(units, "orders.eu")
    assert waited == sorted(set_levels(units), reverse=True)
    assert sum(DELAY_UNIT_MS << level for level in waited) == units * DELAY_UNIT_MS
    assert destination == "orders.eu"
    assert len(delay_key(units, "orders.eu").split(".")) == DELAY_LEVELS + 1


def test_queue_names_with_dots_or_wildcards_cannot_catch_each_others_delays() -> None:
    tokens = {destination_token(name) for name in ["a", "a.b", "b", "a.*", "#", "a.#"]}
    assert len(tokens) == 6 and all("." not in t and "*" not in t for t in tokens)


def test_a_delay_beyond_the_ladder_is_refused() -> None:
    with pytest.raises(BrokerError, match="delay ladder"):
        delay_units(200 * 86400)


# -- dead letters -----------------------------------------------------------------------------


def test_dead_letter_reason_time_and_count_round_trip(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    broker = open_broker()
    broker.publish(queue, b"first")
    broker.publish(queue, b"second")
    one = first(broker, [queue])
    assert one is not None
    broker.retry_later(one)
    two = first(broker, [queue])
    assert two is not None and two.body == b"second"
    before = time.time()
    broker.dead_letter(two, "bad input: ‘naïve’ ✗ at line 3")
    again = first(broker, [queue])
    assert again is not None and (again.body, again.delivery_count) == (b"first", 2)
    broker.dead_letter(again, "oom_killed: exceeded 64 MiB")

    listed = broker.dead_letters(queue)
    assert [(d.body, d.reason, d.delivery_count) for d in listed] == [
        (b"second", "bad input: ‘naïve’ ✗ at line 3", 1),
        (b"first", "oom_killed: exceeded 64 MiB", 2)]
    assert all(before <= d.dead_at <= time.time() for d in listed)
    assert broker.dead_letters(queue) == listed, "browsing changed or lost dead letters"
    assert broker.dead_letters(queue, limit=1) == listed[:1]
    # a browse hands its dead letters back with a nack, which RabbitMQ applies a moment
    # later: a passive declare right after may still miss one (seen under load)
    wait_for(lambda: broker.depth(queue).dead == 2, 30, "both dead letters counted again")

    assert broker.requeue_dead(queue, [listed[1].id]) == 1
    back = first(broker, [queue])
    assert back is not None and (back.body, back.delivery_count) == (b"first", 1)
    broker.ack(back)
    assert [d.body for d in broker.dead_letters(queue)] == [b"second"]
    assert broker.requeue_dead(queue) == 1
    assert broker.depth(queue).dead == 0


def test_dead_letters_deleted_between_the_existence_check_and_the_read_are_none(
        open_broker: Callable[..., RabbitMQBroker], queue: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The flaky `dead-letters list` traceback: `<queue>.dead` existed when asked (passive
    declare) and was gone at the basic.get (ChannelClosedByBroker 404). Here it is deleted
    at that very moment, on another connection: no dead letters, nothing taken."""
    broker = open_broker()
    broker.publish(queue, b"poison")
    delivery = first(broker, [queue])
    assert delivery is not None
    broker.dead_letter(delivery, "bad")
    real = broker._passive

    def then_deleted(name: str) -> tuple[int, int] | None:
        answer = real(name)
        if name.endswith(".dead") and answer is not None:
            connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
            try:
                connection.channel().queue_delete(name)
            finally:
                connection.close()
        return answer

    monkeypatch.setattr(broker, "_passive", then_deleted)
    assert broker.dead_letters(queue) == []
    broker.publish(queue, b"poison 2")   # declares <queue>.dead again
    again = first(broker, [queue])
    assert again is not None
    broker.dead_letter(again, "bad")
    assert broker.requeue_dead(queue) == 0
    assert broker.purge_dead(queue, ["any"]) == 0


def test_rabbitmq_dead_letters_a_message_over_its_delivery_limit(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    open_broker(delivery_limit="1").publish(queue, b"crashes its worker")
    for _ in range(2):  # each consumer takes it and dies without settling
        holder = open_broker(delivery_limit="1")
        assert first(holder, [queue]) is not None
        holder.close()
    admin = open_broker(delivery_limit="1")
    deadline = time.monotonic() + 10
    while admin.depth(queue).dead == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    [dead] = admin.dead_letters(queue)
    assert dead.body == b"crashes its worker"
    assert "delivery_limit" in dead.reason and dead.dead_at > 0


# -- depth --------------------------------------------------------------------------------------


def test_depth_without_the_management_plugin_raises_and_says_how_to_enable_it(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    broker = open_broker(management="http://127.0.0.1:9")
    broker.publish(queue, b"x")
    with pytest.raises(BrokerError, match="rabbitmq-plugins enable rabbitmq_management"):
        broker.depth(queue)


def test_queues_holding_dead_letters_unlisted_without_the_management_plugin_is_a_warning(
        open_broker: Callable[..., RabbitMQBroker], queue: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """`status` and `dead-letters list` still show what they know, and say what is missing."""
    from conveyor.readers.queues import ALWAYS, known_queues
    broker = open_broker(management="http://127.0.0.1:9")
    with pytest.raises(BrokerError, match="cannot list the queues holding dead letters: "):
        broker.dead_queues()
    assert known_queues(None, [queue], broker) == [queue, *ALWAYS]
    assert "queues holding dead letters are not all listed (pass them with -Q)" in caplog.text


def test_purge_empties_ready_delayed_and_dead(open_broker: Callable[..., RabbitMQBroker],
                                              queue: str) -> None:
    consumer = open_broker()
    consumer.publish(queue, b"poison")
    delivery = first(consumer, [queue])
    assert delivery is not None
    consumer.dead_letter(delivery, "test")
    consumer.close()
    broker = open_broker()
    broker.publish(queue, b"ready")
    broker.publish(queue, b"later", delay=30)
    broker.publish(queue, b"much later", delay=3000)
    assert broker.depth(queue).delayed == 2
    assert broker.purge(queue) == 4
    assert broker.depth(queue).active + broker.depth(queue).delayed == 0


@pytest.mark.slow
@pytest.mark.parametrize("priority", [0, 9])
def test_in_flight_held_by_another_connection_comes_from_the_management_api(
        open_broker: Callable[..., RabbitMQBroker], queue: str, priority: int) -> None:
    """Whatever band the held message came from (priority 9: `<queue>.pri.3`), and with a
    message of another band ready: depth sums the bands for the autoscaler."""
    holder, observer = open_broker(), open_broker()
    holder.publish(queue, b"held", priority=priority)
    held = first(holder, [queue])
    assert held is not None
    holder.pause()  # its consumers go (at its next call), the held delivery stays its own
    holder.extend_lease(held)
    holder.publish(queue, b"ready", priority=5)
    deadline = time.monotonic() + 30  # RabbitMQ refreshes these statistics every ~5 s
    depth = observer.depth(queue)  # a new queue: waits for its first statistics
    while depth.in_flight != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        depth = observer.depth(queue)
    assert (depth.ready, depth.in_flight) == (1, 1)


def test_is_empty_sees_delayed_work_without_waiting_for_statistics(
        open_broker: Callable[..., RabbitMQBroker], queue: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another connection consumes a queue too new for statistics: its in-flight count would
    take seconds to learn, and a burst worker asking while work is delayed must not wait."""
    holder, observer = open_broker(), open_broker()
    holder.publish(queue, b"held")
    assert first(holder, [queue]) is not None
    observer.publish(queue, b"later", delay=60)

    def never(queue: str, consumers: int) -> int:
        raise AssertionError("is_empty waited for the management plugin's statistics")
    monkeypatch.setattr(observer, "_await_statistics", never)
    assert not observer.is_empty([queue])


def test_a_consumer_on_3_10_is_warned_of_the_broker_wide_consumer_timeout(
        open_broker: Callable[..., RabbitMQBroker], queue: str,
        caplog: pytest.LogCaptureFixture) -> None:
    broker = open_broker()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert first(broker, [queue], timeout=0.3) is None
    warned = [r.getMessage() for r in caplog.records if "consumer_timeout" in r.getMessage()]
    assert bool(warned) == (broker.server_version < (3, 12))


def test_first_listed_queue_wins_even_when_a_later_one_was_buffered_first(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    broker = open_broker()
    later = queue + "-b"
    broker.publish(later, b"b1")
    broker.publish(later, b"b2")
    steps = broker.consume([queue, later], prefetch=2, timeout=0.3)
    held = next(steps)
    assert held is not None and held.body == b"b1"  # b2 now sits in the local buffer
    broker.publish(queue, b"a1")
    # Wait for RabbitMQ to count a1 (ready, or pushed into this consumer's buffer), not luck.
    deadline = time.monotonic() + 10
    while broker.depth(queue).ready != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    nxt = next(steps)
    assert nxt is not None and nxt.body == b"a1"
    broker.ack(held)
    broker.ack(nxt)


# -- ack coalescing (no server) ----------------------------------------------------------------


def test_ack_ledger_sends_a_run_as_one_multiple_ack_and_stops_at_unseen_tags() -> None:
    ledger, sent = AckLedger(), []
    for tag in (1, 2, 3, 4):
        ledger.add(tag, "q", "c", pushed=True)
    for tag in (1, 2, 4):
        ledger.settle(tag)
    ledger.flush(lambda tag, multiple: sent.append((tag, multiple)))
    assert sent == [(2, True), (4, False)]  # 3 is still held: 4 goes alone
    ledger.add(6, "q", "get 6", pushed=False)  # 5: delivered, not dispatched by pika yet
    ledger.settle(3)
    ledger.settle(6)
    sent.clear()
    ledger.flush(lambda tag, multiple: sent.append((tag, multiple)))
    assert sent == [(3, False), (6, False)], "a multiple ack must never cover unseen tag 5"
    assert ledger.unacked == {}


def test_ack_ledger_passes_tags_pika_rejected_on_cancel() -> None:
    ledger, sent = AckLedger(), []
    for tag in (1, 3):  # 2 was rejected by pika when its consumer was cancelled
        ledger.add(tag, "q", "c", pushed=True)
    ledger.settle(1)
    ledger.settle(3)
    ledger.flush(lambda tag, multiple: sent.append((tag, multiple)))
    assert sent == [(3, True)]
    assert ledger.floor == 3


def test_a_paused_consumer_hands_back_what_it_buffered(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    draining, other = open_broker(), open_broker()
    for body in (b"running", b"b1", b"b2"):
        draining.publish(queue, body)
    steps = draining.consume([queue], prefetch=4, timeout=0.3)
    held = next(steps)
    assert held is not None and held.body == b"running"
    draining.pause()
    draining.extend_lease(held)  # a draining worker still heartbeats its running tasks
    got = [first(other, [queue], timeout=5, prefetch=2) for _ in range(2)]
    assert sorted((d.body, d.delivery_count) for d in got if d is not None) == [
        (b"b1", 2), (b"b2", 2)]
    draining.ack(held)


def test_reading_ahead_hands_out_no_more_than_prefetch_and_gives_the_rest_back(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """A worker's consumer (`ahead=1`): RabbitMQ may push one delivery beyond what is held,
    so it is at hand when a held one is acked; it is never handed out early, counts as
    ready, and goes back when the consumer pauses (or its connection closes)."""
    worker, other = open_broker(), open_broker()
    for body in (b"1", b"2", b"3", b"4"):
        worker.publish(queue, body)
    steps = worker.consume([queue], prefetch=2, timeout=0.3, ahead=1)
    held = [next(steps), next(steps)]
    assert [d.body for d in held if d is not None] == [b"1", b"2"]
    assert next(steps) is None, "a third delivery was handed out beyond prefetch=2"
    sub = worker._sub
    assert sub is not None and len(sub.buffers[queue]) == 1, "nothing was read ahead"
    depth = worker.depth(queue)
    assert (depth.ready, depth.in_flight) == (2, 2)
    worker.ack(held[0])  # sent at once: the read-ahead one is handed out without waiting
    third = steps.send(0.0)
    assert third is not None and third.body == b"3"
    worker.pause()
    worker.extend_lease(held[1])
    back = first(other, [queue], timeout=5)  # read ahead again after the ack, or not yet
    assert back is not None and back.body == b"4" and back.delivery_count in (1, 2)
    other.ack(back)
    for delivery in (held[1], third):
        worker.ack(delivery)


def test_a_batch_claim_streams_in_order_and_rejects_nothing(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """claim_more above a few messages uses a consumer of its own (`_stream`), cancelled
    once its credit is used: nothing is rejected back (a quorum queue would count that
    toward its delivery limit), and the cancelled consumer's deliveries stay ours to ack."""
    worker = open_broker()
    worker.publish_many([Publication(queue, str(i).encode()) for i in range(41)])
    steps = worker.consume([queue], prefetch=1, timeout=5, ahead=2)
    held = next(steps)
    assert held is not None and held.body == b"0"
    batch = worker.claim_more([queue], 30)
    assert [int(d.body) for d in batch] == list(range(3, 33))  # 1 and 2 are read ahead
    assert {d.receipt.consumer for d in batch} - {None} and \
        all(not d.receipt.consumer.startswith("get ") for d in batch), "not streamed"
    rest = worker.claim_more([queue], 30)
    assert [int(d.body) for d in rest] == list(range(33, 41))
    assert {d.delivery_count for d in [held, *batch, *rest]} == {1}
    assert worker.ack_many([held, *batch, *rest]) == []
    assert worker.depth(queue) == Depth(2, 0, 0, 0)  # the two read ahead


def test_batch_claims_racing_for_one_queue_take_each_message_once_and_none_is_lost(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """Two consumers' batches share a queue, so each gets part of what the ready count
    promised and stops early (`_taken_by_others`); what one closes unacked comes back."""
    one, two, after = open_broker(), open_broker(), open_broker()
    one.publish_many([Publication(queue, str(i).encode()) for i in range(200)])
    steps = [b.consume([queue], prefetch=1, timeout=5) for b in (one, two)]
    firsts = [next(s) for s in steps]
    taken: dict[RabbitMQBroker, list[Delivery]] = {one: [], two: []}
    while True:
        got = [(b, b.claim_more([queue], 150)) for b in (one, two)]
        for b, batch in got:
            taken[b] += batch
        if not any(batch for _, batch in got):
            break
    bodies = [d.body for d in [*firsts, *taken[one], *taken[two]] if d is not None]
    assert sorted(bodies) == sorted(str(i).encode() for i in range(200))
    assert {d.delivery_count for d in taken[one] + taken[two]} == {1}
    assert two.ack_many([d for d in [firsts[1], *taken[two]] if d is not None]) == []
    two.close()  # else its consumer, free again, takes some of what comes back
    one.close()  # its held batch was never acked: RabbitMQ redelivers it
    back = after.consume([queue], prefetch=500, timeout=5)
    again = [next(back) for _ in range(1 + len(taken[one]))]
    assert sorted(d.body for d in again if d is not None) == sorted(
        d.body for d in [firsts[0], *taken[one]] if d is not None)
    assert after.ack_many([d for d in again if d is not None]) == []


def test_a_batch_whose_messages_another_consumer_takes_stops_early_and_loses_none(
        open_broker: Callable[..., RabbitMQBroker], queue: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ready count promised 150, but a rival consumer freed its window right after it
    was read and RabbitMQ pushes it part of them: the batch stops once nothing more comes
    and the queue is empty (not at its deadline), each message went to exactly one of
    them, and nothing was rejected back (every delivery count is 1)."""
    worker = open_broker()
    worker.publish_many([Publication(queue, str(i).encode()) for i in range(300)])
    rival = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = rival.channel()
        channel.basic_qos(prefetch_count=100)
        rivals: list[tuple[int, bytes]] = []
        channel.basic_consume(queue, lambda ch, m, p, body: rivals.append(
            (m.delivery_tag, body)))
        wait_for(lambda: rival.process_data_events(0.05) or len(rivals) == 100, timeout=10)
        steps = worker.consume([queue], prefetch=1, timeout=5)
        held = next(steps)
        assert held is not None
        passive, freed = worker._passive, []

        def passive_then_rival_acks(name: str) -> tuple[int, int] | None:
            counts = passive(name)
            if not freed:
                freed.append(rivals[-1][0])
                channel.basic_ack(rivals[-1][0], multiple=True)  # its window is free again
            return counts
        monkeypatch.setattr(worker, "_passive", passive_then_rival_acks)
        batch = worker.claim_more([queue], 150)
        rival.process_data_events(0.5)
        assert 0 < len(batch) < 150, "the rival took none of the batch: nothing was raced"
        assert {d.delivery_count for d in [held, *batch]} == {1}
        ours = [held.body, *(d.body for d in batch)]
        theirs = [body for _, body in rivals]
        assert sorted(ours + theirs) == sorted(str(i).encode() for i in range(300))
        assert worker.ack_many([held, *batch]) == []
        if rivals[-1][0] > freed[0]:
            channel.basic_ack(rivals[-1][0], multiple=True)
    finally:
        rival.close()


def test_an_earlier_queue_nobody_pushed_from_is_checked_with_basic_get(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """The fallback behind first-listed-first: a delivery of a later queue is only handed out
    after each earlier queue was found empty. Here the earlier queue has no consumer on this
    channel (as when its deliveries are still on the wire), so only basic.get can find it."""
    broker = open_broker()
    later = queue + "-b"
    broker.publish(later, b"b1")
    broker.publish(queue, b"a1")
    broker._start_consuming([later], 2)
    deadline = time.monotonic() + 5
    while not broker._sub.buffers.get(later) and time.monotonic() < deadline:  # type: ignore[union-attr]
        broker._pump()
    [taken] = broker._claim([queue, later], 1)
    assert (taken.queue, taken.body, taken.delivery_count) == (queue, b"a1", 1)
    broker._held(1)
    broker.ack(taken)
    assert broker.depth(queue) == Depth(0, 0, 0, 0)


def test_publish_many_declares_again_a_queue_deleted_under_it(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """A batch RabbitMQ returns as unroutable (an operator deleted the queue after this
    broker declared it) is declared again and sent again, each message once."""
    broker = open_broker()
    broker.publish_many([Publication(queue, b"before")])
    assert broker.purge(queue) == 1
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        connection.channel().queue_delete(queue)
    finally:
        connection.close()
    broker.publish_many([Publication(queue, b"a"), Publication(queue, b"b")])
    got = []
    for delivery in broker.consume([queue], prefetch=2, timeout=0.5):
        if delivery is None:
            break
        got.append(delivery.body)
        broker.ack(delivery)
    assert sorted(got) == [b"a", b"b"]


def test_a_per_version_queue_expires_once_unused_and_a_plain_one_never(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """`<queue>@<version>` (a worker's code version, README "Runs pinned to their code") and
    every queue it brings (bands, dead letters, delay levels) are declared with x-expires:
    RabbitMQ deletes them once no consumer has used them for `pinned_queue_expires`, so past
    deploys leave nothing. The plain queue beside it stays."""
    pinned = f"{queue}@v1"
    broker = open_broker(pinned_queue_expires="1")
    broker.publish_many([Publication(queue, b"plain"), Publication(pinned, b"pinned")])
    broker.publish(pinned, b"later", delay=60)
    assert first(broker, [pinned]) is not None    # a consumer used it (and hands it back)
    broker.close()
    family = [*bands_high_first(pinned), f"{pinned}.dead", *(
        f"{pinned}.delay.{k}" for k in set_levels(delay_units(60)))]
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        def exists(name: str) -> bool:
            channel = connection.channel()
            try:
                channel.queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker:
                return False
            channel.close()
            return True
        wait_for(lambda: not any(exists(name) for name in family), 60,
                 "the per-version queues to expire")
        assert exists(queue)
    finally:
        connection.close()
        delete_rabbitmq_queues(pinned)    # what a failure left


# -- priority bands ------------------------------------------------------------------------


def test_priorities_map_to_four_bands() -> None:
    """The mapping the README documents: 0 (and below), 1-3, 4-6, 7 and above."""
    assert [band_of(p) for p in (-5, 0, 1, 3, 4, 6, 7, 9, 255)] == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    assert [band_queue("q", b) for b in range(4)] == ["q", "q.pri.1", "q.pri.2", "q.pri.3"]
    assert even_units(3, 0) == 3 and even_units(3, 2) == 4 and even_units(4, 1) == 4


def test_a_priority_keeps_its_band_through_delay_retry_and_dead_letters(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """A delayed high message arrives in its band (the ladder's exchange 0, never level 0);
    retry_later and a dead letter moved back keep its priority; depth sums the bands."""
    broker = open_broker()
    for body in (b"low 0", b"low 1", b"low 2"):
        broker.publish(queue, body)
    # delayed long enough to be seen delayed: 0.3 s could pass before a loaded machine's
    # first depth (passive declares and a management listing) was read
    broker.publish(queue, b"high", priority=5, delay=2.0)
    assert wait_for(lambda: broker.depth(queue) == Depth(3, 0, 1, 0), timeout=10)
    assert wait_for(lambda: broker.depth(queue).ready == 4, timeout=10)
    delivery = first(broker, [queue], timeout=5)
    assert delivery is not None and (delivery.body, delivery.priority) == (b"high", 5)
    assert wait_for(lambda: broker.depth(queue) == Depth(3, 1, 0, 0), timeout=10)
    broker.retry_later(delivery, 0.0)
    again = first(broker, [queue], timeout=5)
    assert again is not None and (again.body, again.priority, again.delivery_count) == (
        b"high", 5, 2)
    broker.dead_letter(again, "to see it come back in its band")
    assert broker.requeue_dead(queue) == 1
    back = first(broker, [queue], timeout=5)
    assert back is not None and (back.body, back.priority) == (b"high", 5)
    broker.ack(back)
    lows = []
    for d in broker.consume([queue], timeout=0.5):
        if d is None:
            break
        lows.append(d.body)
        broker.ack(d)
    assert lows == [b"low 0", b"low 1", b"low 2"]
    assert broker.purge(queue) == 0


def test_default_priority_traffic_never_asks_the_bands(
        open_broker: Callable[..., RabbitMQBroker], queue: str) -> None:
    """A queue whose messages all have the default priority is served from its own queue
    alone: no passive declare or get of a band, however many it consumes."""
    broker = open_broker()
    broker.publish_many([Publication(queue, b"%d" % i) for i in range(50)])
    asked: list[str] = []
    passive = broker._passive

    def counted(name: str) -> tuple[int, int] | None:
        asked.append(name)
        return passive(name)
    broker._passive = counted  # type: ignore[method-assign]
    got = []
    for delivery in broker.consume([queue], prefetch=2, timeout=0.5, ahead=8):
        if delivery is None:
            break
        got.append(int(delivery.body))
        broker.ack(delivery)
    assert got == list(range(50))
    assert not [name for name in asked if ".pri." in name], asked
