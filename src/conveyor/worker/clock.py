"""The worker's own deadlines, kept by a thread that never waits on the broker.

Why: the supervisor's loop calls the broker, and a broker that went away holds such a call
for up to its `retry_seconds` (60 s by default), then every held settle once more. The
promises a worker makes by itself (a hard time limit kills on time, a soft one warns on
time, a drain ends on time, a second stop signal kills at once) must not wait behind that.
So they are timers here: a heap of due times on the monotonic clock and one thread that
sleeps until the earliest, runs its action, and sleeps again. The heap is also why a kill
comes within milliseconds of its limit, where the loop's one-second turns made it 0.5-0.9 s
late.

An action runs on this thread: it must be short and must never call the broker (it signals
a runner through its pidfd). The loop sees what follows (the runner's exit) through the
pool, and settles it whenever the broker answers.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("conveyor.worker")
#: Cancelled timers are dropped from the heap when they come due, or all at once when they
#: are more than this many and half the heap (tasks that end long before a long limit).
COMPACT_AFTER = 64


@dataclass(eq=False, slots=True)
class Timer:
    """One action due at `when` (time.monotonic()); `Clock.cancel` it if it is moot."""

    when: float
    action: Callable[[], None] = field(repr=False)
    done: bool = False  # fired or cancelled


class Clock:
    """`clock.at(when, action)` runs `action` on the clock's thread at `when`."""

    def __init__(self, on_failure: Callable[[], None]) -> None:
        """`on_failure`: called (from the clock's thread) if an action raised; `failure`
        then says what, and the worker stops (fail fast: its promises no longer hold)."""
        self.failure: str | None = None
        self._on_failure = on_failure
        self._heap: list[tuple[float, int, Timer]] = []
        self._cancelled = 0
        self._order = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="worker-clock", daemon=True)
        self._thread.start()

    def at(self, when: float, action: Callable[[], None]) -> Timer:
        timer = Timer(when, action)
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._order), timer))
            if self._heap[0][2] is timer:  # sooner than what the thread sleeps until
                self._cond.notify()
        return timer

    def cancel(self, timer: Timer) -> None:
        with self._cond:
            if timer.done:
                return
            timer.done = True
            self._cancelled += 1
            if self._cancelled > COMPACT_AFTER and 2 * self._cancelled > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def __len__(self) -> int:
        """Timers not yet fired nor cancelled."""
        with self._cond:
            return len(self._heap) - self._cancelled

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (timer := self._next_due()) is not None:
            try:
                timer.action()
            except Exception as exc:  # noqa: BLE001 - any failure must stop the worker
                log.exception("a worker timer failed")
                self.failure = f"a worker timer failed: {type(exc).__name__}: {exc}"
                self._on_failure()
                return

    def _next_due(self) -> Timer | None:
        """Sleep until the earliest timer is due and take it; None once closed."""
        with self._cond:
            while not self._closed:
                if self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                    continue
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                if wait is not None and wait <= 0:
                    timer = heapq.heappop(self._heap)[2]
                    timer.done = True
                    return timer
                self._cond.wait(wait)
            return None
