"""The one reconnect helper every transport uses: backoff, give-up message, URL option."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from conveyor.broker import reconnect
from conveyor.broker.reconnect import (
    BACKOFF_CAP,
    JITTER,
    Reconnect,
    Recovery,
    backoff,
    one_line,
    retry_seconds,
)
from conveyor.errors import BrokerConnectionError, BrokerError, ConfigError

LOG = logging.getLogger("conveyor.broker.test")


def test_backoff_doubles_up_to_the_cap_with_the_jitter_added_after_it() -> None:
    """tenacity's wait, driven by a Retrying whose sleep only records the pauses."""
    pauses: list[float] = []
    retrying = Retrying(sleep=pauses.append, wait=backoff(), stop=stop_after_attempt(13),
                        retry=retry_if_exception(lambda e: isinstance(e, OSError)),
                        retry_error_callback=lambda state: "gave up")
    assert retrying(refused) == "gave up" and len(pauses) == 12
    assert 0.1 <= pauses[0] <= 0.1 + JITTER and 0.2 <= pauses[1] <= 0.2 + JITTER
    assert all(BACKOFF_CAP <= p <= BACKOFF_CAP + JITTER for p in pauses[8:])
    assert len(set(pauses[8:])) > 1   # jittered at the cap too: a fleet does not keep step


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
    assert 0.5 <= time.monotonic() - started < 10  # gave up (a loaded machine: later)
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all("\n" not in line and "reconnecting in" in line for line in lines)


def test_a_call_retrying_gives_up_at_once_when_the_process_stops() -> None:
    """A worker's cold stop: a settle retrying an unreachable broker for its 60 s must not
    hold the worker's exit (the message comes back anyway); once stopping, later calls try
    once."""
    reconnect = Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 60)

    def refused() -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    threading.Timer(0.3, reconnect.stopping.set).start()
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match="not retried further: this process is "
                                                    "stopping"):
        reconnect.call("settling", refused)
    assert time.monotonic() - started < 10  # at the stop, not after its 60 s
    attempts: list[float] = []

    def counted() -> None:
        attempts.append(time.monotonic())
        refused()

    started = time.monotonic()
    with pytest.raises(BrokerConnectionError):
        reconnect.call("settling", counted)
    assert len(attempts) == 1 and time.monotonic() - started < 10


def test_other_errors_are_not_retried() -> None:
    reconnect = Reconnect("Thing", LOG, lambda e: isinstance(e, OSError), 30)
    with pytest.raises(ValueError):
        reconnect.call("x", lambda: int("nope"))


def flaky(*outcomes: BaseException | str) -> Callable[[], str]:
    """An attempt that raises or returns each of `outcomes` in turn."""
    left = iter(outcomes)

    def attempt() -> str:
        outcome = next(left)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    return attempt


def test_a_consumer_retries_until_it_works_or_is_woken() -> None:
    recovery = Recovery(Reconnect("Thing", LOG, lambda e: isinstance(e, OSError), 0.1))
    never = threading.Event()
    assert recovery.attempt("claiming", flaky(OSError("down"), OSError("down"), "up"),
                            never) == "up"
    assert not recovery.failing and recovery.pause() == 0
    woken = threading.Event()
    woken.set()  # wakeup(): the step ends without waiting for the broker
    assert recovery.attempt("claiming", flaky(OSError("down")), woken) is None
    assert recovery.failing and 0 < recovery.pause() <= 0.1 + JITTER


def test_a_consumer_step_waits_out_the_pause_left_by_the_last_one(
        caplog: pytest.LogCaptureFixture) -> None:
    """The outage's attempts are one tenacity loop across steps: the count goes on, a step
    that ends before the next attempt is due tries nothing, and success ends the outage."""
    caplog.set_level(logging.WARNING, logger=LOG.name)
    recovery = Recovery(Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 1),
                        note="held ones come back")
    recovery.failed("claiming", OSError("down"))   # a consumer's call lost the connection
    calls: list[str] = []

    def down() -> str:
        calls.append("tried")
        raise OSError("still down")
    assert recovery.attempt("subscribing", down, threading.Event(), budget=0.0) is None
    assert calls == []   # not due yet
    assert recovery.attempt("subscribing", down, threading.Event(), budget=0.5) is None
    assert calls and recovery.failing
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("claiming: Thing at x://h is unreachable (OSError: down); held "
                               "ones come back; attempt 1 failed, reconnecting in 0.")
    assert len(lines) == 1 + len(calls) and all(
        line.startswith("subscribing: Thing at x://h is unreachable (OSError: still down); "
                        f"held ones come back; attempt {n} failed, reconnecting in ")
        for n, line in enumerate(lines[1:], start=2))
    assert recovery.attempt("subscribing", lambda: "up", threading.Event()) == "up"
    assert not recovery.failing


def test_a_consumer_raises_what_is_not_a_lost_connection() -> None:
    recovery = Recovery(Reconnect("Thing", LOG, lambda e: isinstance(e, OSError), 1))
    recovery.failed("claiming", OSError("down"))
    with pytest.raises(ValueError):
        recovery.attempt("claiming", flaky(ValueError("bad")), threading.Event())
    assert not recovery.failing   # that outage's loop is over; the next starts afresh


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


def refused() -> None:
    raise ConnectionRefusedError(111, "Connection refused")


@pytest.fixture
def first_contact(monkeypatch: pytest.MonkeyPatch) -> float:
    """FIRST_CONTACT_SECONDS shrunk to 0.3 s; the process's patience restored afterwards."""
    monkeypatch.setattr(reconnect, "FIRST_CONTACT_SECONDS", 0.3)
    monkeypatch.setattr(reconnect.PATIENCE, "one_shot", False)
    return 0.3


def test_a_one_shot_command_gives_up_on_a_service_never_reached_at_first_contact(
        first_contact: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    started = time.monotonic()
    with reconnect.one_shot(), pytest.raises(
            BrokerConnectionError, match=r"^connect: Thing at x://h did not answer in 0\.3 s "
            r"\(\d+ attempt\(s\); last error ConnectionRefusedError: .*check that it is "
            r"running, and the host and port"):
        Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 60).call(
            "connect", refused)
    assert not reconnect.PATIENCE.one_shot   # only inside
    assert first_contact <= time.monotonic() - started < 10  # not the daemon's 60 s
    assert all(r.levelno == logging.DEBUG for r in caplog.records)  # its one line is the error


def test_a_daemon_says_plainly_once_that_a_service_never_answered_and_keeps_trying(
        first_contact: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOG.name)
    with pytest.raises(BrokerConnectionError, match="stayed unreachable for 1.0 s"):
        Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 1.0).call(
            "connect", refused)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    line = errors[0].getMessage()
    assert "Thing at x://h has not answered yet (0.3 s" in line and "still trying" in line
    assert "retry_seconds=1" in line
    later = [r for r in caplog.records if r.created > errors[0].created]
    assert later and all("reconnecting in" in r.getMessage() for r in later)


def test_a_refusal_stops_the_first_contact_at_once_and_is_retried_after_it(
        first_contact: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # a first contact of 30 s: "at once" is then far from what trying through it would take
    monkeypatch.setattr(reconnect, "FIRST_CONTACT_SECONDS", 30.0)

    def say_no(exc: BaseException) -> str | None:
        return "refused the login (no): fix the password" if "login" in str(exc) else None

    link = Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 0.5, say_no)
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"^connect: Thing at x://h refused the login \(no\): "
                       r"fix the password; retrying would not help$"):
        link.call("connect", lambda: (_ for _ in ()).throw(OSError("login refused")))
    assert time.monotonic() - started < 10
    assert link.call("connect", lambda: "up") == "up" and link.reached
    answers = iter([OSError("login refused"), "up"])   # a node restarting may say no a moment

    def restarting() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)
    assert link.call("publish", restarting) == "up"


def test_an_answer_from_another_kind_of_server_is_not_an_outage() -> None:
    from redis.exceptions import AuthenticationError, InvalidResponse

    from conveyor import refusals
    assert "not as Redis does" in (refusals.redis(InvalidResponse("Protocol Error: b'HTTP'"))
                                   or "")
    assert "fix the user, password" in (refusals.redis(AuthenticationError("WRONGPASS")) or "")
    assert refusals.redis(ConnectionRefusedError()) is None
    missing = OSError('connection failed: FATAL:  database "x" does not exist')
    assert "create it" in (refusals.postgres(missing) or "")
    assert refusals.postgres(OSError("connection failed: Connection refused")) is None


def test_a_consumer_that_never_reached_the_service_stops_at_a_refusal() -> None:
    def say_no(exc: BaseException) -> str | None:
        return "refused the login (no): fix the password" if "login" in str(exc) else None

    recovery = Recovery(Reconnect("Thing at x://h", LOG, lambda e: isinstance(e, OSError), 1,
                                  say_no))
    with pytest.raises(BrokerError, match="refused the login .*retrying would not help$"):
        recovery.attempt("LISTEN", flaky(OSError("login refused")), threading.Event())
    assert not recovery.failing
