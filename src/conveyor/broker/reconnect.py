"""Reconnecting to a broker that went away: one retry policy for every transport, on tenacity.

Why one: each transport used to carry its own loop, each with its own pauses, log lines and
give-up message. Now tenacity (the retry library the design names) runs every one of them:

* pause `BACKOFF_INITIAL` s doubling up to `BACKOFF_CAP`, plus up to `JITTER` s at random so
  a fleet of workers does not reconnect in step (`backoff`, tenacity's wait);
* log one WARNING line per failed attempt, on the transport's logger, without a traceback
  (`Reconnect.say`, tenacity's before_sleep);
* for a bounded call (publish, settle, admin) give up after `retry_seconds` (URL option,
  default `DEFAULT_RETRY_SECONDS`) with a `BrokerConnectionError` that says how long it tried
  (`Reconnect.call`: a `Retrying` with `stop_after_delay`); a consumer never gives up by
  itself: it retries until it is woken, so a worker outlives an outage of any length
  (`Recovery`: one `Retrying` per outage, across the consumer's steps).

The long budget is for outages, after a first contact. A service that has never answered is
more likely a wrong URL or a server not started, and is said plainly after
`FIRST_CONTACT_SECONDS`: a one-shot command (`conveyor status`, `enqueue`: see `one_shot`)
gives up then, in one line, without a line per attempt; a daemon (and the library) says so
once at ERROR and keeps trying for `retry_seconds`. An answer that retrying cannot change (a
login refused, a database that does not exist, a server that is not the one the URL names)
stops at the first contact at once: each transport says which answers are such (`refusal`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from tenacity import (
    AttemptManager,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)
from tenacity.wait import wait_base

from conveyor.broker import positive_option
from conveyor.errors import BrokerConnectionError, Refused, one_line

T = TypeVar("T")
log = logging.getLogger("conveyor.broker")

#: How long a bounded call (publish, settle, admin) keeps trying, unless `?retry_seconds=`.
DEFAULT_RETRY_SECONDS = 60.0
BACKOFF_INITIAL = 0.1
#: The longest pause between two attempts: how late a worker may be to notice a broker back.
BACKOFF_CAP = 5.0
JITTER = 0.25
#: How long a service never reached gets before that is said plainly (see the docstring).
FIRST_CONTACT_SECONDS = 5.0
#: The URL option's one spelling, and the old one still accepted (with a warning).
RETRY_OPTION = "retry_seconds"
DEPRECATED_RETRY_OPTION = "reconnect_timeout"


def retry_seconds(options: dict[str, str], url: str,
                  default: float = DEFAULT_RETRY_SECONDS) -> float:
    """`?retry_seconds=` from a broker URL's query; `?reconnect_timeout=` as its old name."""
    if DEPRECATED_RETRY_OPTION in options and RETRY_OPTION not in options:
        log.warning("broker URL option %s= is deprecated: use %s= (same meaning)",
                    DEPRECATED_RETRY_OPTION, RETRY_OPTION)
        options = {**options, RETRY_OPTION: options[DEPRECATED_RETRY_OPTION]}
    return positive_option(options, RETRY_OPTION, default, url)


def quiet_library_loggers(*names: str) -> None:
    """Silence a client library's own loggers below CRITICAL, unless the application chose
    their level: pika logs every failed connect as several ERROR lines with a traceback, and
    the transport already says what an operator needs in one line per attempt."""
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.CRITICAL)


@dataclass
class Patience:
    """Whether this process gives up on a service it has never reached at
    FIRST_CONTACT_SECONDS (a one-shot command) or keeps trying (a daemon, the library)."""

    one_shot: bool = False


#: This process's patience: the CLI's `one_shot` sets it around a command.
PATIENCE = Patience()


@contextmanager
def one_shot(yes: bool = True) -> Iterator[None]:
    """Inside, this process runs a command that answers and exits: a service it has never
    reached fails it at FIRST_CONTACT_SECONDS with one line (no line per attempt before)."""
    before, PATIENCE.one_shot = PATIENCE.one_shot, yes
    try:
        yield
    finally:
        PATIENCE.one_shot = before


def never_refused(exc: BaseException) -> str | None:
    return None


@dataclass
class Reconnect:
    """How one transport retries: which errors mean the connection is lost, and where to.

    `refusal(exc)`: why a failed first contact is an answer retrying cannot change (what
    the service said and what to fix, e.g. "refused the login (...): fix the password in the
    broker URL"), or None; such an answer stops the call at once with a BrokerError. After a
    first contact every loss is retried (a node restarting may refuse for a moment).
    """

    where: str  # "RabbitMQ at amqp://guest:***@host:5672/" (redacted)
    logger: logging.Logger
    is_loss: Callable[[BaseException], bool]
    retry_seconds: float = DEFAULT_RETRY_SECONDS
    refusal: Callable[[BaseException], str | None] = never_refused
    #: set when the process stops at once (a worker's cold stop): a call retrying gives up
    #: at its next pause instead of spending its retry_seconds (Broker.stop_retrying)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: whether any attempt has worked yet (the first contact is behind us)
    reached: bool = field(default=False, init=False)
    _said_never: bool = field(default=False, init=False)

    def call(self, what: str, attempt: Callable[[], T],
             first_error: BaseException | None = None) -> T:
        """`attempt()` until it works, fails otherwise, or `retry_seconds` have passed
        (FIRST_CONTACT_SECONDS in a one-shot command that has never reached the service);
        tenacity's `Retrying` runs the loop, `stopping` cuts its pause short. The first
        attempt is made before it: a call that works (nearly all) costs no retry machinery.

        `first_error`: the attempt already failed once (the caller's fast path); it counts
        as the first attempt.
        """
        if first_error is None:
            try:
                result = attempt()
            except Exception as exc:
                first_error = exc
            else:
                self.reached = True
                return result
        budget, tries = self._budget(), _Tries(self, what)
        retrying = Retrying(
            sleep=tries.sleep, wait=self.wait(budget),
            stop=stop_after_delay(budget) | stop_when_event_set(self.stopping),
            retry=retry_if_exception(self.retryable), before_sleep=tries.before_sleep,
            retry_error_callback=tries.give_up)
        outcome: T = retrying(self.vetted(what, attempt, first_error))
        self.reached = True
        return outcome

    def vetted(self, what: str, attempt: Callable[[], T],
               first_error: BaseException | None = None) -> Callable[[], T]:
        """`attempt` with a refusal raised as `Refused` (which is not retried), after
        `first_error` if there is one."""
        pending = [first_error] if first_error is not None else []

        def vetted() -> T:
            try:
                if pending:
                    raise pending.pop()
                return attempt()
            except Exception as exc:
                self.refuse(what, exc)
                raise
        return vetted

    def retryable(self, error: BaseException) -> bool:
        """tenacity's retry test: a lost connection, not a refusal."""
        return not isinstance(error, Refused) and self.is_loss(error)

    def wait(self, budget: float | None = None) -> Callable[[RetryCallState], float]:
        """tenacity's wait: `backoff()`, shortened so that the last attempt of a bounded call
        comes at its `budget`, and so that a daemon says plainly, at FIRST_CONTACT_SECONDS,
        that the service has never answered (`say`)."""
        pauses = backoff()

        def wait(state: RetryCallState) -> float:
            pause, elapsed = float(pauses(state)), state.seconds_since_start or 0.0
            if budget is not None:
                pause = min(pause, budget - elapsed)
            if not (self.reached or PATIENCE.one_shot or self._said_never):
                pause = min(pause, max(0.0, FIRST_CONTACT_SECONDS - elapsed))
            return max(0.0, pause)
        return wait

    def say(self, what: str, state: RetryCallState, note: str = "") -> None:
        """tenacity's before_sleep: the one line per failed attempt (a DEBUG one in a one-shot
        command that has never reached the service: its one line comes when it gives up), and
        once, at FIRST_CONTACT_SECONDS, the ERROR line that a daemon has never reached it."""
        error, attempts = _error(state), state.attempt_number
        if PATIENCE.one_shot and not self.reached:
            self.logger.debug("%s: %s: attempt %d failed (%s)", what, self.where, attempts,
                              one_line(error))
            return
        self._log(what, error, state.upcoming_sleep, attempts, note)
        elapsed = state.seconds_since_start or 0.0
        if not (self.reached or self._said_never) and elapsed >= FIRST_CONTACT_SECONDS:
            self._said_never = True
            self.logger.error("%s: %s has not answered yet (%.1f s, %d attempt(s); last error "
                              "%s): %s; still trying, for up to retry_seconds=%g s", what,
                              self.where, elapsed, attempts, one_line(error),
                              NEVER_REACHED_ADVICE, self.retry_seconds)

    def refuse(self, what: str, error: BaseException) -> None:
        """Raise a refusal of the first contact as `Refused`, which retrying would not help."""
        if not self.reached:
            reason = self.refusal(error)
            if reason:
                raise Refused(f"{what}: {self.where} {reason}; retrying would not "
                              "help") from error

    def _budget(self) -> float:
        """How long this call may keep trying."""
        if PATIENCE.one_shot and not self.reached:
            return min(self.retry_seconds, FIRST_CONTACT_SECONDS)
        return self.retry_seconds

    def _log(self, what: str, error: BaseException, pause: float, attempts: int,
             note: str = "") -> None:
        self.logger.warning("%s: %s is unreachable (%s); %sattempt %d failed, reconnecting in "
                            "%.1f s", what, self.where, one_line(error),
                            f"{note}; " if note else "", attempts, pause)

    def gave_up(self, what: str, elapsed: float, attempts: int,
                error: BaseException) -> BrokerConnectionError:
        if PATIENCE.one_shot and not self.reached:
            return BrokerConnectionError(
                f"{what}: {self.where} did not answer in {elapsed:.1f} s ({attempts} "
                f"attempt(s); last error {one_line(error)}); {NEVER_REACHED_ADVICE}")
        advice = NEVER_REACHED_ADVICE if not self.reached else (
            "check that it is running and reachable, or raise ?retry_seconds= in the broker URL")
        if self.stopping.is_set():
            advice = "not retried further: this process is stopping"
        return BrokerConnectionError(
            f"{what}: {self.where} stayed unreachable for {elapsed:.1f} s ({attempts} "
            f"attempt(s), retry_seconds={self.retry_seconds:g}; last error {one_line(error)}); "
            f"{advice}")


#: What to do about a service never reached.
NEVER_REACHED_ADVICE = ("check that it is running, and the host and port in the broker URL")


def backoff() -> wait_base:
    """tenacity's wait between attempts: BACKOFF_INITIAL s doubling up to BACKOFF_CAP, plus up
    to JITTER s at random. Not `wait_exponential_jitter`: it caps after adding its jitter, so
    every pause at the cap would be BACKOFF_CAP exactly, and a fleet of workers retrying
    through a long outage would keep the step in which they lost the broker."""
    return wait_exponential(multiplier=BACKOFF_INITIAL, max=BACKOFF_CAP) + wait_random(0, JITTER)


def _error(state: RetryCallState) -> BaseException:
    """The exception of a failed attempt (tenacity asks us only about failed ones)."""
    assert state.outcome is not None
    error = state.outcome.exception()
    assert error is not None
    return error


@dataclass
class _Tries:
    """One bounded call's hooks into tenacity's `Retrying`: they say each failed attempt,
    and give up with what the last one said."""

    link: Reconnect
    what: str
    last: tuple[float, int, BaseException] | None = None  # elapsed, attempts, error

    def before_sleep(self, state: RetryCallState) -> None:
        self.last = (state.seconds_since_start or 0.0, state.attempt_number, _error(state))
        self.link.say(self.what, state)

    def sleep(self, seconds: float) -> None:
        """The pause, cut short by `stopping` (a cold stop): then give up at once rather
        than try once more."""
        if self.link.stopping.wait(seconds) and self.last is not None:
            elapsed, attempts, error = self.last
            raise self.link.gave_up(self.what, elapsed, attempts, error) from error

    def give_up(self, state: RetryCallState) -> NoReturn:
        """tenacity's retry_error_callback: the budget is spent (or the process stops)."""
        error = _error(state)
        raise self.link.gave_up(self.what, state.seconds_since_start or 0.0,
                                state.attempt_number, error) from error


class Recovery:
    """A consumer's way back from a lost connection, kept across its steps.

    A consumer never gives up by itself (a worker outlives an outage of any length), and
    its steps must end at their timeout or at `wakeup()`. So one tenacity `Retrying`, without
    a stop, spans the whole outage: it decides whether to retry, the pause, and says each
    failed attempt; its `sleep` only notes when the next attempt is due, and the consumer's
    steps wait for that moment (`attempt`). A pause interrupted is not started again.
    """

    def __init__(self, link: Reconnect, note: str = "") -> None:
        """`note`: what its line per failed attempt adds (kombu: what becomes of the
        deliveries held from the lost connection)."""
        self.link, self.note = link, note
        self._tries: Iterator[AttemptManager] | None = None  # the outage's tenacity loop
        self._next: AttemptManager | None = None  # its next attempt,
        self._due = 0.0  # due then (time.monotonic())
        self._what = ""  # what the last failed attempt was doing, for its line

    @property
    def failing(self) -> bool:
        """Whether an outage is in progress (the last attempt failed)."""
        return self._tries is not None

    def pause(self) -> float:
        """Seconds until the next attempt is due (0 when no outage is in progress)."""
        return max(0.0, self._due - time.monotonic()) if self.failing else 0.0

    def attempt(self, what: str, fn: Callable[[], T], stop: threading.Event,
                budget: float = math.inf) -> T | None:
        """`fn()` once the pause after the last failed attempt is over, again after each
        failure; None if `stop` is set, or `budget` seconds pass, before one works. What is
        not a lost connection (a refusal of the first contact too) is raised."""
        deadline = time.monotonic() + budget
        if self._tries is None:   # no outage: a step that works costs this one try
            try:
                result = fn()
            except Exception as exc:
                self.failed(what, exc)
            else:
                self.link.reached = True
                return result
        while True:
            if time.monotonic() < self._due:
                left = min(self._due, deadline) - time.monotonic()
                if stop.wait(max(0.0, left)) or time.monotonic() < self._due:
                    return None
            try:
                result = fn()
            except Exception as exc:
                self.failed(what, exc)
                continue
            self._tries = self._next = None
            self.link.reached = True
            return result

    def failed(self, what: str, error: BaseException) -> None:
        """Count a failed attempt (`attempt`'s, or a consumer's call that lost the
        connection): tenacity says it and sets the next one's time, or raises `error` if it
        is not to be retried."""
        self._what = what
        if self._tries is None:
            self._tries = iter(Retrying(
                sleep=self._note, wait=self.link.wait(), retry=retry_if_exception(
                    self.link.retryable), before_sleep=self._say))
            self._next = next(self._tries)
        assert self._next is not None
        try:
            with self._next:
                self.link.refuse(what, error)   # a refusal of the first contact: not retried
                raise error
            self._next = next(self._tries)
        except BaseException:
            self._tries = self._next = None
            raise

    def _note(self, seconds: float) -> None:
        """tenacity's sleep: the consumer's steps wait, so that `wakeup()` ends them."""
        self._due = time.monotonic() + seconds

    def _say(self, state: RetryCallState) -> None:
        self.link.say(self._what, state, self.note)
