"""Reconnecting to a broker that went away: one backoff and one retry loop for every transport.

Why one: each transport used to carry its own loop (tenacity in three spellings and one
hand-written), each with its own pauses, log lines and give-up message. Now all of them:

* pause `BACKOFF_INITIAL` s doubling up to `BACKOFF_CAP`, plus up to `JITTER` s at random so
  a fleet of workers does not reconnect in step (`Backoff`);
* log one WARNING line per failed attempt, on the transport's logger, without a traceback;
* for a bounded call (publish, settle, admin) give up after `retry_seconds` (URL option,
  default `DEFAULT_RETRY_SECONDS`) with a `BrokerConnectionError` that says how long it tried
  (`Reconnect.call`); a consumer never gives up by itself: it retries until woken
  (`Reconnect.until`), so a worker outlives an outage of any length.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from conveyor.broker import positive_option
from conveyor.errors import BrokerConnectionError

T = TypeVar("T")
log = logging.getLogger("conveyor.broker")

#: How long a bounded call (publish, settle, admin) keeps trying, unless `?retry_seconds=`.
DEFAULT_RETRY_SECONDS = 60.0
BACKOFF_INITIAL = 0.1
#: The longest pause between two attempts: how late a worker may be to notice a broker back.
BACKOFF_CAP = 5.0
JITTER = 0.25
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


def one_line(exc: BaseException | None) -> str:
    """`Type: first line of the message`, for a log line or an error."""
    if exc is None:
        return "no error"
    text = str(exc).strip().splitlines()
    if not text and exc.args:  # pika's connection errors wrap the cause and print nothing
        text = (str(exc.args[0]).strip() or repr(exc.args[0])).splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def quiet_library_loggers(*names: str) -> None:
    """Silence a client library's own loggers below CRITICAL, unless the application chose
    their level: pika logs every failed connect as several ERROR lines with a traceback, and
    the transport already says what an operator needs in one line per attempt."""
    for name in names:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.CRITICAL)


class Backoff:
    """Exponential backoff with jitter; it lasts across calls (a consumer's steps)."""

    def __init__(self, initial: float = BACKOFF_INITIAL, cap: float = BACKOFF_CAP,
                 jitter: float = JITTER) -> None:
        self.initial, self.cap, self.jitter = initial, cap, jitter
        self.attempts = 0
        self._next = 0.0

    def failed(self) -> float:
        """Record a failed attempt; return the pause before the next one."""
        self.attempts += 1
        pause = min(self.cap, self.initial * 2 ** min(self.attempts - 1, 30))
        pause += random.uniform(0.0, self.jitter)
        self._next = time.monotonic() + pause
        return pause

    def pause(self) -> float:
        """Seconds until the next attempt may start."""
        return max(0.0, self._next - time.monotonic())

    def reset(self) -> None:
        self.attempts = 0
        self._next = 0.0


@dataclass
class Reconnect:
    """How one transport retries: which errors mean the connection is lost, and where to."""

    where: str  # "RabbitMQ at amqp://guest:***@host:5672/" (redacted)
    logger: logging.Logger
    is_loss: Callable[[BaseException], bool]
    retry_seconds: float = DEFAULT_RETRY_SECONDS

    def call(self, what: str, attempt: Callable[[], T],
             first_error: BaseException | None = None) -> T:
        """`attempt()` until it works, fails otherwise, or `retry_seconds` have passed.

        `first_error`: the attempt already failed once (the caller's fast path).
        """
        backoff, started, error = Backoff(), time.monotonic(), first_error
        while True:
            if error is not None:
                elapsed = time.monotonic() - started
                pause = min(backoff.failed(), self.retry_seconds - elapsed)  # last try on time
                if pause <= 0:
                    raise self.gave_up(what, elapsed, backoff.attempts, error) from error
                self._log(what, error, pause, backoff.attempts)
                time.sleep(pause)
            try:
                return attempt()
            except Exception as exc:
                if not self.is_loss(exc):
                    raise
                error = exc

    def until(self, what: str, attempt: Callable[[], T], stop: threading.Event,
              backoff: Backoff | None = None) -> T | None:
        """`attempt()` until it works or `stop` is set (then None): a consumer's loop."""
        backoff = backoff or Backoff()
        while True:
            try:
                result = attempt()
            except Exception as exc:
                if not self.is_loss(exc):
                    raise
                pause = backoff.failed()
                self._log(what, exc, pause, backoff.attempts)
                if stop.wait(pause):
                    return None
                continue
            backoff.reset()
            return result

    def _log(self, what: str, error: BaseException, pause: float, attempts: int) -> None:
        self.logger.warning("%s: %s is unreachable (%s); attempt %d failed, reconnecting in "
                            "%.1f s",
                            what, self.where, one_line(error), attempts, pause)

    def gave_up(self, what: str, elapsed: float, attempts: int,
                error: BaseException) -> BrokerConnectionError:
        return BrokerConnectionError(
            f"{what}: {self.where} stayed unreachable for {elapsed:.1f} s ({attempts} "
            f"attempt(s), retry_seconds={self.retry_seconds:g}; last error {one_line(error)}); "
            "check that it is running and reachable, or raise ?retry_seconds= in the broker URL")
