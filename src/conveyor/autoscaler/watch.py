"""Wake-up from zero: while a target is at zero, one thread blocks on the broker for it.

Polling every few seconds would make the first task after a quiet night wait up to a
whole interval (KEDA: 30 s by default). Instead, `Broker.watch` returns as soon as the
target's queues hold more than its activation threshold (SQLite: the publishers' wake
channel; Postgres: LISTEN/NOTIFY; others: a depth read every 0.25 s), and the daemon
decides at once. Watching never claims a message nor takes a consumer's wake-up.

Each watch opens a broker object of its own when its target reaches zero (a transport
may hold a listener on it) and closes it when the target leaves zero: an unread Postgres
LISTEN session would hold back the server's notification queue, and an SQLite listener
would be pinged by every publish for nothing. Between the two it sleeps on an event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from conveyor.broker import Inspector

log = logging.getLogger("conveyor.autoscaler")

#: Longest single watch; `wakeup()` ends one early, so this only bounds staleness.
SLICE = 30.0
#: Pause after a broker error before watching again (the daemon sees the error itself).
ERROR_PAUSE = 1.0


class ZeroWatch:
    """Calls `poke()` when work arrives for a target the daemon has marked at zero."""

    def __init__(self, name: str, queues: Sequence[str], above: int,
                 open_broker: Callable[[], Inspector], poke: Callable[[], None]) -> None:
        self.name, self.queues, self.above = name, list(queues), above
        self._open_broker = open_broker
        self._poke = poke
        self._zero = threading.Event()
        self._stopping = threading.Event()
        self._broker: Inspector | None = None
        self._lock = threading.Lock()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def at_zero(self, zero: bool) -> None:
        """The daemon's word on the target: watch while it is at zero, sleep otherwise."""
        if zero:
            self._zero.set()
            return
        self._zero.clear()
        with self._lock:  # end a watch in progress: its broker is closed next
            if self._broker is not None:
                self._broker.wakeup()

    def _run(self) -> None:
        try:
            while self._zero.wait() and not self._stopping.is_set():
                if self._watch_once() and self._zero.is_set():
                    self._zero.clear()
                    self._poke()
                if not self._zero.is_set():
                    self._close_broker()
        except BaseException as exc:  # the daemon fails fast on it: never limp along deaf
            self.failure = exc
            self._poke()
        finally:
            self._close_broker()

    def _close_broker(self) -> None:
        with self._lock:
            broker, self._broker = self._broker, None
        if broker is not None:
            broker.close()

    def _watch_once(self) -> bool:
        """One watch; True if work may be there (also when the broker failed: the daemon
        then reads depth itself, sees the error, and applies the fallback)."""
        try:
            broker = self._broker_once()
            if broker is None:
                return False
            return broker.watch(self.queues, SLICE, above=self.above)
        except Exception as exc:
            log.warning("target %s: watching queues %s for new work failed (%s: %s); "
                        "retrying in %gs", self.name, ",".join(self.queues),
                        type(exc).__name__, exc, ERROR_PAUSE)
            self._stopping.wait(ERROR_PAUSE)
            return True

    def _broker_once(self) -> Inspector | None:
        with self._lock:
            if self._broker is None and not self._stopping.is_set():
                self._broker = self._open_broker()
            return self._broker

    def stop(self) -> None:
        self._stopping.set()
        self._zero.set()
        with self._lock:
            if self._broker is not None:
                self._broker.wakeup()
        self._thread.join(timeout=10)
