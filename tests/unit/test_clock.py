"""The worker's clock (worker/clock.py): timers fire in order and on time, a cancelled one
never fires, and an action that raises stops the worker instead of silently ending its
promises. Real threads, real time (short: tens of milliseconds)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from conveyor.worker.clock import COMPACT_AFTER, Clock


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock(on_failure=lambda: None)
    yield c
    c.close()


def test_timers_fire_in_the_order_they_are_due_not_set(clock: Clock) -> None:
    fired: list[str] = []
    done = threading.Event()

    def last() -> None:
        fired.append("late")
        done.set()

    now = time.monotonic()
    clock.at(now + 0.10, last)
    clock.at(now + 0.05, lambda: fired.append("soon"))  # sooner than what the thread sleeps to
    clock.at(now - 1.0, lambda: fired.append("overdue"))
    assert done.wait(30)
    assert fired == ["overdue", "soon", "late"]
    assert len(clock) == 0


def test_a_timer_fires_close_to_its_time(clock: Clock) -> None:
    fired: list[float] = []
    done = threading.Event()

    def action() -> None:
        fired.append(time.monotonic())
        done.set()

    due = time.monotonic() + 0.05
    clock.at(due, action)
    assert done.wait(30)
    assert 0 <= fired[0] - due < 0.5  # generous: the machine is shared


def test_a_cancelled_timer_never_fires_and_many_are_compacted(clock: Clock) -> None:
    fired: list[int] = []
    far = time.monotonic() + 3600
    timers = [clock.at(far, lambda: fired.append(0)) for _ in range(3 * COMPACT_AFTER)]
    soon = clock.at(time.monotonic() + 0.05, lambda: fired.append(-1))
    clock.cancel(soon)
    for timer in timers:
        clock.cancel(timer)
    clock.cancel(timers[0])  # twice: counted once
    assert len(clock) == 0
    assert len(clock._heap) <= COMPACT_AFTER + 1  # dropped, not kept until they come due
    time.sleep(0.2)
    assert fired == []


def test_an_action_that_raises_stops_the_worker() -> None:
    told = threading.Event()
    clock = Clock(on_failure=told.set)
    try:
        def broken() -> None:
            raise ZeroDivisionError("the action's own bug")

        clock.at(time.monotonic(), broken)
        assert told.wait(30)
        assert clock.failure is not None and "ZeroDivisionError" in clock.failure
    finally:
        clock.close()
