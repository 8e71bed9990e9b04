"""Postgres claims in batches and acks with the next claim: what may never go wrong.

A consumer stepping `consume` fast claims `ahead` more rows than its free slots, and an
`ack_soon` is carried by its next claim (one statement), or sent once owed OWED_SECONDS.
These tests count the transport's statements by name (the `what` of each call) and read
the queue's depth from Postgres: nothing acked comes back, nothing claimed ahead is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from conveyor.broker import Delivery, Publication, postgres
from conveyor.broker.postgres import OWED_SECONDS, READ_AHEAD_WINDOW, PostgresBroker
from tests.contract.conftest import OpenPgBroker


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every consumer counts as fast (claims READ_AHEAD_WINDOW apart on a loaded machine)."""
    monkeypatch.setattr(postgres, "READ_AHEAD_WINDOW", 60.0)


def fill(broker: PostgresBroker, queue: str, n: int) -> None:
    broker.publish_many([Publication(queue, str(i).encode()) for i in range(n)])


def counting(broker: PostgresBroker) -> list[str]:
    """The names of the consume loop's statements from now on, in order."""
    calls: list[str] = []
    run = broker._consumer_run

    def counted(what: str, fn: Callable[[Any], Any]) -> Any:
        calls.append(what)
        return run(what, fn)

    broker._consumer_run = counted  # type: ignore[method-assign]
    return calls


def step(steps: Any) -> Delivery:
    delivery = steps.send(0.0)
    assert delivery is not None
    return delivery


def batch(broker: PostgresBroker, queue: str) -> tuple[Any, list[Delivery]]:
    """A consumer of 2 slots, reading 8 ahead, holding two deliveries and a batch of 8."""
    steps = broker.consume([queue], prefetch=2, timeout=5, ahead=8)
    first = next(steps)
    assert first is not None
    second = step(steps)  # claimed with the first: its slot was free
    broker.ack_soon(first)
    third = step(steps)  # a claim of 1, carrying the first's ack: 2 rows so far, not > 2
    assert broker.claimed_ahead == 0
    broker.ack_soon(second)
    fourth = step(steps)  # a claim of 1 + 8, carrying the second's ack
    assert broker.claimed_ahead == 8
    return steps, [third, fourth]


@pytest.mark.parametrize("ack_commit", ["async", "sync"])
def test_a_fast_consumer_claims_a_batch_and_its_acks_ride_the_next_claim(
        open_pg_broker: OpenPgBroker, pg_url: str, unique: str, ack_commit: str,
        fast: None) -> None:
    broker = open_pg_broker(f"{pg_url}&ack_commit={ack_commit}")
    fill(broker, unique, 40)
    steps = broker.consume([unique], prefetch=2, timeout=5, ahead=8)
    held = [next(steps)]
    calls = counting(broker)
    bodies = []
    while (delivery := steps.send(0.0)) is not None:
        held.append(delivery)
        done = held.pop(0)
        assert done is not None
        bodies.append(int(done.body))
        broker.ack_soon(done)
    for delivery in held:
        assert delivery is not None
        bodies.append(int(delivery.body))
        broker.ack_soon(delivery)
    assert sorted(bodies) == list(range(40)) and bodies == sorted(bodies)
    assert calls.count("claim") <= 40 // 9 + 4, calls  # 2, 1, then 1 + 8 per claim
    assert "ack" not in calls, calls  # every ack rode a claim
    assert broker.owed_for is not None  # the last two: owed until a claim, close or due
    broker.close()
    assert open_pg_broker().depth(unique).active == 0


def test_a_slow_consumer_claims_only_its_free_slots(open_pg_broker: OpenPgBroker,
                                                   unique: str) -> None:
    """Tasks longer than READ_AHEAD_WINDOW: nothing waits behind them in this consumer."""
    broker = open_pg_broker()
    fill(broker, unique, 10)
    steps = broker.consume([unique], prefetch=1, timeout=5, ahead=8)
    for first in (next(steps), None, None):
        delivery = first or step(steps)
        assert broker.claimed_ahead == 0
        assert broker.depth(unique).in_flight == 1
        time.sleep(READ_AHEAD_WINDOW * 1.5)
        broker.ack_soon(delivery)


def test_slots_of_long_tasks_freeing_together_claim_nothing_ahead(open_pg_broker: OpenPgBroker,
                                                                  unique: str) -> None:
    """Two claims a millisecond apart, but one row each after long tasks: not short tasks."""
    broker = open_pg_broker()
    fill(broker, unique, 12)
    steps = broker.consume([unique], prefetch=2, timeout=5, ahead=8)
    held = [next(steps), step(steps)]
    time.sleep(READ_AHEAD_WINDOW * 1.5)
    for delivery in held:
        assert delivery is not None
        broker.ack_soon(delivery)
        step(steps)
        assert broker.claimed_ahead == 0
    assert broker.depth(unique).in_flight == 2


def test_an_owed_ack_falls_due_and_is_sent_without_a_claim(
        open_pg_broker: OpenPgBroker, unique: str, fast: None) -> None:
    broker = open_pg_broker()
    fill(broker, unique, 12)
    steps, (third, fourth) = batch(broker, unique)
    broker.ack_soon(fourth)
    due = broker.owed_for
    assert due is not None and 0 < due <= OWED_SECONDS
    time.sleep(OWED_SECONDS)
    owed_for = broker.owed_for
    assert owed_for is not None and owed_for <= 0
    fifth = step(steps)  # handed out from the batch: no claim, so the step sends the ack
    assert broker.owed_for is None and broker.claimed_ahead == 7
    assert broker.depth(unique).in_flight == 9  # the third, the fifth, 7 claimed ahead
    broker.ack(third)
    broker.ack(fifth)


def test_owed_acks_are_sent_on_close_and_the_rest_given_back(
        open_pg_broker: OpenPgBroker, unique: str, fast: None) -> None:
    broker = open_pg_broker()
    fill(broker, unique, 12)
    _, held = batch(broker, unique)
    for delivery in held:
        broker.ack_soon(delivery)
    broker.close()
    depth = open_pg_broker().depth(unique)
    assert (depth.ready, depth.in_flight) == (8, 0)  # 4 acked, 8 read ahead given back


def test_claimed_ahead_given_back_is_ready_at_once(open_pg_broker: OpenPgBroker, unique: str,
                                                  fast: None) -> None:
    broker = open_pg_broker()
    fill(broker, unique, 12)
    _, held = batch(broker, unique)
    broker.give_back_claimed()
    assert broker.claimed_ahead == 0
    depth = broker.depth(unique)
    assert (depth.ready, depth.in_flight) == (8, 2)
    for delivery in held:
        broker.ack(delivery)


def test_an_owed_ack_whose_lease_lapsed_is_never_claimed_again(
        open_pg_broker: OpenPgBroker, unique: str) -> None:
    """Its lease expired and nobody took it: the claim that carries the ack deletes it and
    must not also lease it (the row is due in the waiting index)."""
    broker = open_pg_broker(lease_seconds=0.2)
    fill(broker, unique, 2)
    steps = broker.consume([unique], prefetch=1, timeout=5)
    delivery = next(steps)
    assert delivery is not None and delivery.body == b"0"
    time.sleep(0.3)
    broker.ack_soon(delivery)
    assert step(steps).body == b"1"
    depth = broker.depth(unique)
    assert (depth.ready, depth.in_flight) == (0, 1)


def test_an_owed_ack_of_a_message_claimed_again_is_logged_not_raised(
        open_pg_broker: OpenPgBroker, unique: str, caplog: pytest.LogCaptureFixture) -> None:
    owner, rival = open_pg_broker(lease_seconds=0.2), open_pg_broker()
    fill(owner, unique, 2)
    steps = owner.consume([unique], prefetch=1, timeout=5)
    delivery = next(steps)
    assert delivery is not None
    time.sleep(0.3)
    taken = next(rival.consume([unique], prefetch=1, timeout=5))
    assert taken is not None and taken.body == delivery.body
    owner.ack_soon(delivery)
    with caplog.at_level(logging.WARNING, "conveyor.broker.postgres"):
        assert step(steps).body == b"1"
    assert f"ack of message {delivery.receipt[0]} " in caplog.text
    assert "no longer ours" in caplog.text
    rival.ack(taken)  # still the rival's to settle
