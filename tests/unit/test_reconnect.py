"""The one reconnect helper every transport uses: backoff, give-up message, URL option."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from conveyor.broker.reconnect import (
    BACKOFF_CAP,
    JITTER,
    Backoff,
    Reconnect,
    one_line,
    retry_seconds,
)
from conveyor.errors import BrokerConnectionError, ConfigError

LOG = logging.getLogger("conveyor.broker.test")


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    backoff = Backoff(initial=0.1)
    pauses = [backoff.failed() for _ in range(12)]
    assert 0.1 <= pauses[0] <= 0.1 + JITTER and 0.2 <= pauses[1] <= 0.2 + JITTER
    assert all(BACKOFF_CAP <= p <= BACKOFF_CAP + JITTER for p in pauses[8:])
    assert 0 < backoff.pause() <= BACKOFF_CAP + JITTER
    backoff.reset()
    assert backoff.pause() == 0 and backoff.attempts == 0


def test_a_bounded_call_gives_up_after_retry_seconds_saying_how_long_and_how_often(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOG.name)
    reconnect = Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 0.5)

    def refused() -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match=r"^publishing: Thing at x://h stayed "
                       r"unreachable for 0\.5 s \(\d+ attempt\(s\), retry_seconds=0\.5"):
        reconnect.call("publishing", refused)
    assert 0.5 <= time.monotonic() - started < 1.5
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("\n" not in line and "reconnecting in" in line for line in lines)


def test_other_errors_are_not_retried() -> None:
    reconnect = Reconnect("Thing", LOG, lambda e: isinstance(e, OSError), 30)
    with pytest.raises(ValueError):
        reconnect.call("x", lambda: int("nope"))


def test_a_consumer_loop_retries_until_it_works_or_is_stopped() -> None:
    reconnect = Reconnect("Thing", LOG, lambda e: isinstance(e, OSError), 0.1)
    attempts = iter([OSError("down"), OSError("down"), "up"])

    def flaky() -> str:
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert reconnect.until("claiming", flaky, threading.Event(), Backoff(initial=0.01)) == "up"
    def down() -> str:
        raise OSError("down")

    woken = threading.Event()
    woken.set()  # wakeup(): the step ends without waiting for the broker
    assert reconnect.until("claiming", down, woken) is None


def test_retry_seconds_has_one_spelling_and_the_old_one_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    assert retry_seconds({}, "u") == 60.0
    assert retry_seconds({"retry_seconds": "5"}, "u") == 5.0
    with caplog.at_level(logging.WARNING):
        assert retry_seconds({"reconnect_timeout": "7"}, "u") == 7.0
    assert [r.getMessage() for r in caplog.records] == [
        "broker URL option reconnect_timeout= is deprecated: use retry_seconds= (same meaning)"]
    with pytest.raises(ConfigError, match="retry_seconds='soon' must be a positive number"):
        retry_seconds({"retry_seconds": "soon"}, "redis://h")


def test_one_line_shows_what_pika_wraps() -> None:
    assert one_line(OSError("a\nb")) == "OSError: a"
    assert one_line(RuntimeError(ValueError())) == "RuntimeError: ValueError()"
