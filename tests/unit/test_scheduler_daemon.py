"""The daemon's waker: one thread that calls wake() when the earliest deadline arrives."""

from __future__ import annotations

import threading
import time

from conveyor.scheduler.daemon import Waker


def test_the_earliest_deadline_wins_and_fires_once() -> None:
    woke = threading.Event()
    waker = Waker(woke.set)
    try:
        now = time.time()
        waker.at(now + 30)
        waker.at(now + 0.05)          # earlier: replaces
        waker.at(now + 10)            # later: ignored
        assert woke.wait(5)
        assert waker.fired() and not waker.fired()
        woke.clear()
        assert not woke.wait(0.2)     # nothing else was due soon
    finally:
        waker.close()


def test_replace_moves_the_alarm_later_and_none_clears_it() -> None:
    woke = threading.Event()
    waker = Waker(woke.set)
    try:
        waker.at(time.time() + 0.05)
        waker.at(None, replace=True)
        assert not woke.wait(0.3)
        waker.at(time.time() - 1, replace=True)   # already due: fires at once
        assert woke.wait(5)
    finally:
        waker.close()
