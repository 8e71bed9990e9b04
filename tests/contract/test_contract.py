"""The conformance suite: what every transport promises (see `conveyor.broker.base`).

Every test runs once per transport in `ENABLED`, against the real server.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from conveyor.broker import Broker, Depth, Publication
from tests.contract.conftest import CONSUMER, ENV
from tests.support import first

MakeBroker = Callable[..., Broker]


def skip_unless_kept(broker: Broker, guarantee: str) -> None:
    """Skip where the transport names `guarantee` among those it cannot keep, and why."""
    reason = getattr(broker, "unsupported", {}).get(guarantee)
    if reason:
        pytest.skip(f"not supported by {type(broker).__name__}: {reason}")


def wait_for_depth(broker: Broker, queue: str, want: Callable[[Depth], bool],
                   timeout: float = 5.0) -> Depth:
    deadline = time.monotonic() + timeout
    depth = broker.depth(queue)
    while not want(depth) and time.monotonic() < deadline:
        time.sleep(0.05)
        depth = broker.depth(queue)
    return depth


def test_publish_consume_ack(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b'{"hello": 1}')
    assert wait_for_depth(broker, queue, lambda d: d.ready == 1).ready == 1
    delivery = first(broker, [queue])
    assert delivery is not None
    assert (delivery.body, delivery.queue, delivery.delivery_count) == (b'{"hello": 1}', queue, 1)
    assert wait_for_depth(broker, queue, lambda d: d.in_flight == 1) == Depth(0, 1, 0, 0)
    broker.ack(delivery)
    assert wait_for_depth(broker, queue, lambda d: d.in_flight == 0) == Depth(0, 0, 0, 0)
    assert first(broker, [queue], timeout=0.5) is None


def test_empty_queue_depth_is_zero(make_broker: MakeBroker, queue: str) -> None:
    assert make_broker().depth(queue) == Depth(0, 0, 0, 0)


def test_is_empty_counts_ready_delayed_and_in_flight(make_broker: MakeBroker,
                                                     queue: str) -> None:
    """What a --burst worker asks when idle: nothing ready, delayed or held anywhere."""
    broker = make_broker()
    assert broker.is_empty([queue])
    broker.publish(queue, b"later", delay=1.0)
    assert not broker.is_empty([queue])
    delivery = first(broker, [queue], timeout=10)
    assert delivery is not None
    assert not broker.is_empty([queue])
    broker.ack(delivery)
    broker.publish(f"{queue}-b", b"now")
    assert not broker.is_empty([queue, f"{queue}-b"])
    assert taken(broker, f"{queue}-b") == b"now"
    assert wait_for_depth(broker, queue, lambda d: d.in_flight == 0).in_flight == 0
    assert broker.is_empty([queue, f"{queue}-b"])


def test_fifo_within_a_queue(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    for i in range(5):
        broker.publish(queue, str(i).encode())
    wait_for_depth(broker, queue, lambda d: d.ready == 5)
    assert bodies_in_turn(broker, queue, 5) == [b"0", b"1", b"2", b"3", b"4"]


def bodies_in_turn(broker: Broker, queue: str, count: int, idle: float = 5.0) -> list[bytes]:
    """The bodies of `count` deliveries of one consume loop, each acked, in the order it gave
    them; fewer if it stays idle for `idle` seconds (a 0.5 s idle read [] on kombu+redis at a
    load average of 15, and a loop that stops at `count` never waits for the idle end)."""
    got: list[bytes] = []
    for delivery in broker.consume([queue], timeout=idle):
        if delivery is None:
            break
        got.append(delivery.body)
        broker.ack(delivery)
        if len(got) == count:
            break
    return got


def test_first_listed_queue_first(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    broker.publish(queue + "-low", b"low")
    broker.publish(queue + "-high", b"high")
    wait_for_depth(broker, queue + "-low", lambda d: d.ready == 1)
    delivery = first(broker, [queue + "-high", queue + "-low"])
    assert delivery is not None and delivery.body == b"high"
    broker.ack(delivery)
    broker.purge(queue + "-low")


def test_higher_priority_first(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    if not broker.supports_priority:
        pytest.skip(f"{type(broker).__name__} does not order by priority")
    for body, priority in [(b"p0", 0), (b"p5", 5), (b"p1", 1)]:
        broker.publish(queue, body, priority=priority)
    wait_for_depth(broker, queue, lambda d: d.ready == 3)
    assert bodies_in_turn(broker, queue, 3) == [b"p5", b"p1", b"p0"]


#: The consumer of the priority test: held deliveries, and what RabbitMQ may push beyond
#: them (a worker's `--read-ahead`), or Postgres claim beyond them while its claims come
#: fast; the other transports claim nothing beyond `prefetch`.
PREFETCH, AHEAD = 2, 8


def test_high_priority_overtakes_a_backlog(make_broker: MakeBroker, queue: str,
                                           transport: str) -> None:
    """1,000 low-priority messages queued, then 10 high, published while a consumer works
    through the low ones on its own thread, as a worker does (one at a time, a few ms each):
    the 10 high start before any low message that was still ready when they arrived. The
    lows that start after them are counted from when `publish_many` of the highs RETURNED:
    a low started during the publish may have been claimed before any high arrived. Those
    may only be what the consumer had already taken: `PREFETCH` held (SQLite, Postgres,
    Redis: its last claim; kombu: its qos), plus `AHEAD` read ahead on RabbitMQ and Postgres.
    Within a priority, FIFO."""
    broker, publisher = make_broker(), make_broker()
    if not broker.supports_priority:
        pytest.skip(f"{type(broker).__name__} does not order by priority")
    publisher.publish_many([Publication(queue, b"low %d" % i) for i in range(1000)])
    consumer = BacklogConsumer(broker, queue)
    consumer.start()
    try:
        consumer.wait(lambda started: len(started) >= 5, "the consumer to start low ones")
        publisher.publish_many([Publication(queue, b"high %d" % i, priority=9)
                                for i in range(10)])
        mark = len(consumer.started)   # after the publish returned: see the docstring
        consumer.wait(lambda started: sum(b.startswith(b"high") for b in started) == 10,
                      "the high messages to start")
    finally:
        consumer.stop()
    after = consumer.started[mark:]
    last_high = max(i for i, body in enumerate(after) if body.startswith(b"high"))
    lows = [body for body in after[:last_high] if body.startswith(b"low")]
    window = PREFETCH + (AHEAD if transport in ("rabbitmq", "postgres") else 0)
    print(f"{transport}: {len(lows)} low message(s) started between the highs' publish and "
          f"the last high (window {window}), {mark} before")
    assert len(lows) <= window, f"{len(lows)} low messages started first: {after}"
    highs = [b for b in consumer.started if b.startswith(b"high")]   # some during the publish
    assert highs == [b"high %d" % i for i in range(10)]
    assert consumer.wrong_priority == []
    publisher.purge(queue)


class BacklogConsumer(threading.Thread):
    """Consumes `queue` (prefetch `PREFETCH`, read-ahead `AHEAD`) until stopped, recording
    each body as it starts; each takes 2 ms, then is acked."""

    def __init__(self, broker: Broker, queue: str) -> None:
        super().__init__(name="backlog-consumer", daemon=True)
        self.broker, self.queue = broker, queue
        self.started: list[bytes] = []
        self.wrong_priority: list[tuple[bytes, int]] = []
        self.failure: BaseException | None = None
        self._stop_asked = threading.Event()

    def run(self) -> None:
        steps = self.broker.consume([self.queue], prefetch=PREFETCH, timeout=0.2, ahead=AHEAD)
        try:
            for delivery in steps:
                if self._stop_asked.is_set():
                    break
                if delivery is None:
                    continue
                self.started.append(delivery.body)
                if delivery.priority != (9 if delivery.body.startswith(b"high") else 0):
                    self.wrong_priority.append((delivery.body, delivery.priority))
                time.sleep(0.002)
                self.broker.ack(delivery)
        except BaseException as exc:  # noqa: BLE001 - the test thread reports it
            self.failure = exc
        finally:
            steps.close()

    def wait(self, done: Callable[[list[bytes]], bool], what: str,
             timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.started):
            assert self.failure is None, f"the consumer failed: {self.failure!r}"
            assert self.is_alive() and time.monotonic() < deadline, \
                f"waited {timeout:g} s for {what}: {len(self.started)} started"
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop_asked.set()
        self.join(30)
        assert not self.is_alive(), "the consumer did not stop"


def test_prefetch_bounds_held_deliveries(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    for i in range(4):
        broker.publish(queue, str(i).encode())
    steps = broker.consume([queue], prefetch=2, timeout=10)  # a loaded machine is slow
    held = [next(steps), next(steps)]
    assert all(d is not None for d in held)
    assert steps.send(0.3) is None, "a third delivery was handed out beyond prefetch=2"
    assert held[0] is not None
    broker.ack(held[0])
    third = next(steps)
    assert third is not None and third.body == b"2"


def test_delayed_message_is_not_delivered_early(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    published = time.time()
    broker.publish(queue, b"later", delay=1.5)
    assert wait_for_depth(broker, queue, lambda d: d.delayed == 1).delayed == 1
    assert first(broker, [queue], timeout=0.8) is None
    delivery = first(broker, [queue], timeout=10)
    assert delivery is not None and delivery.body == b"later"
    assert time.time() - published >= 1.5
    broker.ack(delivery)


def test_retry_later_redelivers_with_count_and_new_body(make_broker: MakeBroker,
                                                        queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"attempt-1")
    delivery = first(broker, [queue])
    assert delivery is not None and delivery.delivery_count == 1
    broker.retry_later(delivery, delay=1.0, body=b"attempt-2")
    assert wait_for_depth(broker, queue, lambda d: d.delayed == 1).delayed == 1
    assert first(broker, [queue], timeout=0.5) is None
    again = first(broker, [queue], timeout=10)
    assert again is not None
    assert (again.body, again.delivery_count) == (b"attempt-2", 2)
    broker.retry_later(again)
    third = first(broker, [queue])
    assert third is not None and third.delivery_count == 3 and third.body == b"attempt-2"
    broker.ack(third)


def test_dead_letter_keeps_body_and_reason_and_requeues(make_broker: MakeBroker,
                                                        queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"poison")
    delivery = first(broker, [queue])
    assert delivery is not None
    broker.dead_letter(delivery, "oom_killed: exceeded 64 MiB")
    depth = wait_for_depth(broker, queue, lambda d: d.dead == 1)
    assert depth == Depth(0, 0, 0, 1)
    [dead] = broker.dead_letters(queue)
    assert (dead.body, dead.reason, dead.queue) == (b"poison", "oom_killed: exceeded 64 MiB",
                                                     queue)
    assert dead.delivery_count >= 1
    assert first(broker, [queue], timeout=0.5) is None
    assert broker.requeue_dead(queue, [dead.id]) == 1
    again = first(broker, [queue])
    assert again is not None and again.body == b"poison"
    broker.ack(again)
    assert wait_for_depth(broker, queue, lambda d: d.dead == 0).dead == 0


def test_close_without_settling_redelivers(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    broker.publish(queue, b"x")
    delivery = first(broker, [queue])
    assert delivery is not None
    broker.close()
    other = make_broker()
    again = first(other, [queue], timeout=10)
    assert again is not None and again.body == b"x" and again.delivery_count == 2
    other.ack(again)


def test_leased_delivery_is_not_handed_out_twice(make_broker: MakeBroker, queue: str) -> None:
    owner, rival = make_broker(lease_seconds=1.0), make_broker(lease_seconds=1.0)
    owner.publish(queue, b"mine")
    delivery = first(owner, [queue])
    assert delivery is not None
    rival_steps = rival.consume([queue], timeout=0.25)
    for _ in range(10):  # 2.5 s, well past the 1 s lease, kept alive by heartbeats
        owner.extend_lease(delivery)
        assert next(rival_steps) is None, "a leased delivery was handed to a second consumer"
    owner.ack(delivery)


def test_wakeup_interrupts_a_blocked_consume(make_broker: MakeBroker, queue: str) -> None:
    broker = make_broker()
    steps = broker.consume([queue], timeout=60)
    timer = threading.Timer(0.3, broker.wakeup)
    timer.start()
    started = time.monotonic()
    assert next(steps) is None
    assert time.monotonic() - started < 20  # woken, not after the 60 s timeout
    timer.join()


def test_waiting_consumer_is_woken_by_publish(make_broker: MakeBroker, queue: str) -> None:
    consumer, producer = make_broker(), make_broker()
    steps = consumer.consume([queue], timeout=30)
    timer = threading.Timer(0.3, producer.publish, args=(queue, b"now"))
    started = time.monotonic()
    timer.start()
    delivery = next(steps)
    waited = time.monotonic() - started
    timer.join()
    assert delivery is not None and delivery.body == b"now"
    assert waited < 2.0, f"the consumer polled instead of blocking ({waited:.2f} s)"
    consumer.ack(delivery)


def test_kill_9_of_a_holding_consumer_redelivers(make_broker: MakeBroker, queue: str,
                                                 broker_url: str,
                                                 processes: list[subprocess.Popen[bytes]]
                                                 ) -> None:
    broker = make_broker(lease_seconds=1.0)
    skip_unless_kept(broker, "crash_redelivery")
    broker.publish(queue, b"survives")
    holder = subprocess.Popen([sys.executable, CONSUMER, "hold", broker_url, queue, "1.0"],
                              stdout=subprocess.PIPE, env=ENV)
    processes.append(holder)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == b"claimed 1"
    holder.kill()
    holder.wait()
    again = first(broker, [queue], timeout=15)
    assert again is not None and again.body == b"survives" and again.delivery_count == 2
    broker.ack(again)


@pytest.mark.slow
def test_racing_consumers_process_every_message_once(make_broker: MakeBroker, queue: str,
                                                      broker_url: str, tmp_path: Path,
                                                      processes: list[subprocess.Popen[bytes]]
                                                      ) -> None:
    total = 2000
    broker = make_broker()
    for i in range(total):
        broker.publish(queue, str(i).encode())
    out = tmp_path / "processed.txt"
    for prefetch in (1, 4, 8):
        processes.append(subprocess.Popen(
            [sys.executable, CONSUMER, "drain", broker_url, queue, str(out), "2", str(prefetch)],
            env=ENV))
    for proc in processes:
        assert proc.wait(timeout=110) == 0
    lines = out.read_text().split()
    bodies = Counter(lines[0::2])
    assert len(bodies) == total, f"{total - len(bodies)} messages were never processed"
    twice = [body for body, n in bodies.items() if n > 1]
    assert not twice, f"claimed twice while leased: {twice[:10]}"
    assert set(lines[1::2]) == {"1"}
    assert broker.depth(queue) == Depth(0, 0, 0, 0)


def test_a_dropped_consume_loop_gives_back_what_it_claimed(make_broker: MakeBroker,
                                                           queue: str) -> None:
    broker = make_broker()
    skip_unless_kept(broker, "dropped_loop_give_back")
    for i in range(4):
        broker.publish(queue, str(i).encode())
    steps = broker.consume([queue], prefetch=4, timeout=1.0)
    taken = next(steps)
    assert taken is not None
    steps.close()  # the loop is dropped holding claims it never handed out
    broker.ack(taken)
    rival = make_broker()
    got = []
    for delivery in rival.consume([queue], prefetch=4, timeout=1.0):
        if delivery is None:
            break
        got.append(delivery.body)
        rival.ack(delivery)
    assert sorted(got) == [b"1", b"2", b"3"], "claims of a dropped loop stayed leased"


def test_a_dead_letter_counts_the_deliveries_of_the_delivery_it_came_from(
        make_broker: MakeBroker, queue: str) -> None:
    """The count a dead letter keeps is the dead-lettered delivery's own, across retries
    that replaced the body (the worker dead-letters an OOM hog on its 4th delivery)."""
    broker = make_broker()
    broker.publish(queue, b"attempt-1")
    for attempt in (1, 2, 3):
        delivery = first(broker, [queue])
        assert delivery is not None and delivery.delivery_count == attempt
        broker.retry_later(delivery, body=f"attempt-{attempt + 1}".encode())
    last = first(broker, [queue])
    assert last is not None and (last.body, last.delivery_count) == (b"attempt-4", 4)
    broker.dead_letter(last, "oom_killed: over its memory cap (attempt 4 of 4)")
    wait_for_depth(broker, queue, lambda d: d.dead == 1)
    [dead] = broker.dead_letters(queue)
    assert (dead.body, dead.delivery_count) == (b"attempt-4", 4)


def test_publish_many_stores_each_as_publish_would(make_broker: MakeBroker,
                                                   queue: str) -> None:
    broker = make_broker()
    other = f"{queue}-b"
    broker.publish_many([Publication(queue, b"one"), Publication(other, b"two"),
                         Publication(queue, b"later", delay=1.0), Publication(queue, b"three")])
    broker.publish_many([])
    assert wait_for_depth(broker, queue, lambda d: d.delayed == 1).ready == 2
    bodies = [taken(broker, q) for q in (queue, other, queue)]
    assert sorted(bodies) == [b"one", b"three", b"two"]
    assert taken(broker, queue, timeout=10) == b"later"


def taken(broker: Broker, queue: str, timeout: float = 5.0) -> bytes:
    """The body of the next delivery of `queue`, acked."""
    delivery = first(broker, [queue], timeout)
    assert delivery is not None
    broker.ack(delivery)
    return delivery.body


def test_claim_more_takes_a_batch_beyond_prefetch_in_order(make_broker: MakeBroker,
                                                           queue: str, transport: str) -> None:
    broker = make_broker()
    broker.publish_many([Publication(queue, str(i).encode()) for i in range(6)])
    steps = broker.consume([queue], prefetch=1, timeout=10)
    held = next(steps)
    assert held is not None and held.body == b"0"
    more = broker.claim_more([queue], 10)
    bodies = [d.body for d in more]
    assert bodies == [b"1", b"2", b"3", b"4", b"5"]
    assert broker.outstanding == 1 + len(more)
    for delivery in [held, *more]:
        broker.ack(delivery)
    assert broker.outstanding == 0
    assert wait_for_depth(broker, queue, lambda d: d.active == 6 - 1 - len(more)).active \
        == 6 - 1 - len(more)


def test_a_claimed_batch_never_settled_comes_back(make_broker: MakeBroker, queue: str,
                                                  transport: str) -> None:
    broker = make_broker()
    broker.publish_many([Publication(queue, str(i).encode()) for i in range(4)])
    steps = broker.consume([queue], prefetch=1, timeout=10)  # a live loop, as a worker's
    assert next(steps) is not None
    assert len(broker.claim_more([queue], 10)) == 3
    broker.close()
    other = make_broker()
    steps = other.consume([queue], prefetch=4, timeout=10)
    again = sorted(d.body for d in (next(steps) for _ in range(4)) if d is not None)
    assert again == [b"0", b"1", b"2", b"3"]


def test_peek_reads_the_head_of_the_ready_messages_and_claims_nothing(
        make_broker: MakeBroker, queue: str, transport: str) -> None:
    broker = make_broker()
    broker.publish_many([Publication(queue, str(i).encode()) for i in range(5)])
    broker.publish(queue, b"later", delay=60)
    if broker.peek(queue, 3) is None:
        assert transport.startswith(("rabbitmq", "kombu"))  # it cannot look without taking
        return
    held = first(broker, [queue])
    assert held is not None and held.body == b"0"
    assert broker.peek(queue, 3) == [b"1", b"2", b"3"]  # not the held one, nor the delayed
    assert broker.peek(queue, 100) == [b"1", b"2", b"3", b"4"]
    assert broker.depth(queue) == Depth(4, 1, 1, 0)
    broker.ack(held)


def test_ack_many_acks_each_and_returns_those_no_longer_ours(make_broker: MakeBroker,
                                                             queue: str, transport: str) -> None:
    owner = make_broker(lease_seconds=1.0)
    owner.publish_many([Publication(queue, str(i).encode()) for i in range(4)])
    steps = owner.consume([queue], prefetch=1, timeout=10)
    first_one = next(steps)
    assert first_one is not None
    held = [first_one, *owner.claim_more([queue], 3)]
    assert owner.ack_many([]) == []
    assert owner.ack_many(held[:1]) == []
    assert wait_for_depth(owner, queue, lambda d: d.active == 3).active == 3
    if transport not in ("sqlite", "postgres"):
        return  # leased deliveries answered at once (Redis logs a lost ack_soon's answer)
    time.sleep(1.5)  # the leases lapse and a rival takes one of them
    rival = make_broker()
    taken = next(rival.consume([queue], prefetch=1, timeout=10))
    assert taken is not None
    lost = owner.ack_many(held[1:])
    assert [d.body for d in lost] == [taken.body]
    assert owner.outstanding == 0
    rival.ack(taken)
