"""The broker waker (worker/waker.py): a request returns at once even while a wake-up hangs,
requests made meanwhile are one, and a wake-up that raises is logged, not fatal."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from conveyor.worker.waker import Waker
from tests.support import wait_for


def test_a_request_never_waits_for_a_hanging_wake_up() -> None:
    calls, release = [], threading.Event()

    def hang() -> None:
        calls.append(time.monotonic())
        release.wait(60)

    waker = Waker(hang)
    try:
        waker.request()
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        began = time.monotonic()
        for _ in range(100):
            waker.request()
        assert time.monotonic() - began < 10  # the caller (the runner watch) went on
        time.sleep(0.2)
        assert len(calls) == 1  # one wake-up under way...
        release.set()
        wait_for(lambda: len(calls) >= 2, 30, "the wake-up owed for the requests")
        time.sleep(0.2)
        assert len(calls) == 2  # ...and one more for all the requests made meanwhile
    finally:
        release.set()
        waker.close()


def test_a_wake_up_that_raises_is_logged_and_the_next_one_still_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    done = threading.Event()

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the broker is away")
        done.set()

    waker = Waker(flaky)
    try:
        waker.request()
        time.sleep(0.2)
        waker.request()
        assert done.wait(30)
    finally:
        waker.close()
    assert any("could not wake the broker wait (ConnectionError: the broker is away)"
               in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
