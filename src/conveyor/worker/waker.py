"""Waking the supervisor's broker wait from a thread of its own.

Why: `broker.wakeup()` is a network call on some transports (Redis pushes a wake token over a
connection of its own, kombu publishes to a wake queue), and a broker that hangs (frozen, or
behind a network that drops packets) holds such a call for its timeouts: 5 to 15 s. The
pool's watcher, which reads every runner's report and exit and stamps when each run ended,
asks for the wake-up here and goes back to its runners; this thread does the waking. Requests
that come while a wake-up is under way are one: the loop needs waking once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("conveyor.worker")


class Waker:
    """`request()` from any thread: `wake()` runs soon on the waker's thread."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._wanted = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="broker-waker", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wanted.set()

    def close(self) -> None:
        self._closed = True
        self._wanted.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closed:
                return
            try:
                self._wake()
            except Exception as exc:  # noqa: BLE001 - a missed wake-up costs one step timeout
                log.warning("could not wake the broker wait (%s: %s); the loop wakes at its "
                            "step timeout instead", type(exc).__name__, exc)
