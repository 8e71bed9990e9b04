"""Settles the broker could not take during an outage, held until it answers again.

Why: a worker must outlive a broker outage of any length. A runner's outcome is reported
before its message is settled; the settle (ack, retry, dead-letter, requeue) then waits for
the broker, which retries for its `retry_seconds` and then raises `BrokerConnectionError`.
Instead of that error stopping the worker (and leaving its queues unserved until something
restarts it), the settle is held here and tried again on every turn of the supervisor's
loop, oldest first, until the broker answers. The loop's calls may block that long; what
the worker promises by itself (time limits, drain deadlines) is kept by worker/clock.py.
A lease that expired meanwhile turns the settle into `LeaseLost` (the supervisor logs it):
the message is delivered again, a duplicate of a task that ran, which at-least-once allows.
Whether a long outage should stop the worker instead is the operator's choice
(`--exit-after-outage`, off by default).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from conveyor.errors import BrokerConnectionError, BrokerError

log = logging.getLogger("conveyor.worker")


class HeldSettles:
    """Settles waiting for the broker, in the order they were made."""

    def __init__(self, exit_after: float = 0.0) -> None:
        self.exit_after = exit_after  # seconds of outage before the worker stops; 0: never
        self._held: deque[tuple[str, Callable[[], None]]] = deque()
        self._since: float | None = None  # when the broker first failed to take one

    def __len__(self) -> int:
        return len(self._held)

    def settle(self, label: str, op: Callable[[], None]) -> None:
        """Run `op` now, or hold it if the broker stays unreachable. Behind held ones it
        waits its turn without a try of its own: the loop's `retry` sends them in order,
        and each try while the broker is away costs a whole `retry_seconds`."""
        if self._held:
            self._held.append((label, op))
            return
        try:
            op()
        except BrokerConnectionError as exc:
            self._hold(label, op, exc)

    def retry(self) -> None:
        """Try the held settles again, oldest first; stop at the first the broker refuses."""
        while self._held:
            label, op = self._held[0]
            try:
                op()
            except BrokerConnectionError:
                self._check_exit()
                return
            self._held.popleft()
            if not self._held:
                log.warning("the broker answers again: every held settle was sent")
                self._since = None

    def _hold(self, label: str, op: Callable[[], None], exc: BrokerConnectionError) -> None:
        self._held.append((label, op))
        if self._since is None:
            self._since = time.monotonic()
        log.warning("%s: holding its settle until the broker answers (%s)", label, exc)
        self._check_exit()

    def _check_exit(self) -> None:
        if self.exit_after and self._since is not None \
                and time.monotonic() - self._since >= self.exit_after:
            raise BrokerError(   # not a connection error: retrying is what it stops
                f"the broker has been unreachable for {time.monotonic() - self._since:.0f} s, "
                f"longer than --exit-after-outage={self.exit_after:g}: stopping; the "
                f"{len(self._held)} message(s) whose settle was held are delivered again")
