"""Self-fencing (worker/fencing.py) driven without a process: the real supervisor loop over an
in-memory broker whose deliveries carry a lease, and a fake runner pool whose runner keeps
running until it is killed or told to end. A lease that is not renewed gets its runner killed
before it lapses, and the run is requeued as self-fenced; a lease that is renewed never does.
The same over real brokers and a real partition: tests/integration/test_partitions.py."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Generator, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

from conveyor.broker import Delivery
from conveyor.errors import BrokerConnectionError
from conveyor.worker.clock import Clock
from conveyor.worker.fencing import SelfFence, fits, margin
from conveyor.worker.pool import RunnerPool
from conveyor.worker.run import Run
from tests.unit.test_supervisor import Harness, Recorder, message
from tests.unit.worker_doubles import EXITED_0

LEASE = 0.6


class LeasedBroker:
    """Makes the harness's MemoryBroker lease its deliveries for LEASE seconds from the claim
    (its supervisor's fence told so); renewals fail (`reachable=False`: a partition) or
    succeed."""

    def __init__(self, h: Harness, reachable: bool, granted: float = LEASE) -> None:
        inner = h.broker
        self.reachable, self.renewals = reachable, 0
        inner.lease_seconds = LEASE
        h.supervisor.fence = SelfFence(h.supervisor.clock, h.supervisor.pool, LEASE)
        plain = inner.consume

        def consume(queues: Sequence[str], **kw: Any
                    ) -> Generator[Delivery | None, float | None, None]:
            for delivery in plain(queues, **kw):
                if delivery is not None:
                    delivery.lease_until = time.monotonic() + granted
                yield delivery
        inner.consume = consume
        inner.extend_lease = self.extend_lease

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        if not self.reachable:
            raise BrokerConnectionError("the broker is unreachable (a test's partition)")
        self.renewals += 1


def held(frame: dict[str, Any]) -> None:
    return None   # the runner keeps running until killed or ended


def test_margin_is_a_sixth_of_the_lease_at_least_half_a_second_at_most_half() -> None:
    assert (margin(30.0), margin(3.0), margin(0.6)) == (5.0, 0.5, 0.3)


def test_a_transport_stamped_lease_is_left_alone_and_is_not_fenced_where_renewals_miss_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """RabbitMQ stamps `lease_until` itself (two heartbeat timeouts from its last proven
    round trip): `renewed` leaves it, and a lease the worker's heartbeat cannot keep up with
    turns fencing off (with a WARNING) instead of stopping runs that are fine."""
    assert fits(4.0, 1.0) and fits(120.0, 10.0) and not fits(10.0, 10.0)
    clock, pool = cast(Clock, None), cast(RunnerPool, None)   # neither is reached here
    fence = SelfFence(clock, pool, 4.0, renews=False, renew_every=1.0)
    delivery = Delivery("q", b"", 1, None, lease_until=100.0)
    fence.renewed(delivery, since=50.0)
    assert fence.on and delivery.lease_until == 100.0
    with caplog.at_level(logging.WARNING, logger="conveyor.worker"):
        off = SelfFence(clock, pool, 10.0, renews=False, renew_every=10.0)
    assert not off.on and "self-fencing is off" in caplog.text
    assert not off.lapsing(cast(Run, SimpleNamespace(delivery=delivery)), now=1e9)
    unfenced = SelfFence(clock, pool, math.inf, renews=False, renew_every=10.0)
    assert unfenced.on   # kombu: nothing is stamped, so nothing is fenced, and no warning


def test_a_lease_that_cannot_be_renewed_has_its_runner_killed_before_it_lapses() -> None:
    h = Harness(script=held, concurrency=1)
    LeasedBroker(h, reachable=False)
    h.put(message(reply_to="replies"))
    began = time.monotonic()
    assert h.run() == 0
    took = time.monotonic() - began
    [runner] = h.pool.released
    assert runner.signals == [signal.SIGKILL]     # type: ignore[attr-defined]
    assert h.broker.verbs() == ["retry"]          # requeued: delivered again elsewhere
    assert took < LEASE, f"the runner was killed {took:.2f} s after the claim"
    assert ("finished", "interrupted") in h.recorder.heard


def test_a_renewed_lease_never_fences_its_run() -> None:
    h = Harness(script=held, concurrency=1)
    leased = LeasedBroker(h, reachable=True)
    h.put(message())

    def end_later() -> None:   # after three leases' worth of renewals
        time.sleep(3 * LEASE)
        [runner] = h.pool.held
        h.pool.end(runner, {"outcome": "succeeded", "result": None}, EXITED_0)

    ender = threading.Thread(target=end_later)
    ender.start()
    try:
        assert h.run() == 0
    finally:
        ender.join()
    assert h.broker.verbs() == ["ack"] and leased.renewals > 3
    assert not h.pool.held[0].signals   # type: ignore[attr-defined]
    assert isinstance(h.recorder, Recorder)


def test_a_delivery_whose_lease_lapses_before_it_starts_is_not_started() -> None:
    """Claimed when the broker last answered, its lease nearly spent by the time a runner is
    free (the loop was stuck on the unreachable broker): given back, never started."""
    h = Harness(concurrency=1)
    LeasedBroker(h, reachable=False, granted=0.1)   # within the margin (0.3 s) at once
    h.put(message())
    assert h.run() == 0
    assert h.pool.started == [] and h.broker.verbs() == ["retry"]
