"""The supervisor's side of cancel: refuse what was cancelled, stop what runs.

What was cancelled comes from a `CancelWatch` (conveyor/control/watch.py): a set of ids
read at start and kept current by its thread, so checking a delivery is a set lookup. A run
the watch hears of while it runs is signalled: SIGUSR2 raises `Cancelled` in a Python task
(the soft time limit's mechanism: runners ignore SIGTERM, so a stop signal sent to the whole
process group leaves them to the drain), SIGTERM goes to an exec'd command; SIGKILL follows
after `--cancel-grace` seconds whatever it did. Its outcome is `cancelled`
(worker/outcome.py): acked, never retried nor dead-lettered.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterable

from conveyor.control import names
from conveyor.control.watch import CancelWatch
from conveyor.message import Message
from conveyor.worker.clock import Clock
from conveyor.worker.pool import RunnerPool
from conveyor.worker.run import Run

log = logging.getLogger("conveyor.worker")


class Canceller:
    """`message in canceller`: whether it was cancelled; stops running runs when told."""

    def __init__(self, watch: CancelWatch | None, pool: RunnerPool, clock: Clock, grace: float,
                 running: Callable[[], Iterable[Run]]) -> None:
        """`running`: the runs running now (called from the watch's thread)."""
        self._watch = watch
        self._pool = pool
        self._clock = clock
        self.grace = grace
        self._running = running
        if watch is not None:
            watch.on_cancel = self._heard

    def __contains__(self, message: Message) -> bool:
        """Whether `message` must not start (cancelled, or revoked before it started)."""
        return self._watch is not None and names(self._watch, message, started=False)

    def ready(self) -> None:
        """Wait until what was cancelled has been read (the supervisor started the watch
        behind its pool's start-up), so the first delivery is checked against it."""
        if self._watch is not None:
            self._watch.wait_read()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def started(self, run: Run) -> None:
        """`run` was just started: stop it if it was cancelled meanwhile (the watch may have
        looked for it among the running ones before it was there)."""
        if self._watch is not None and names(self._watch, run.message, started=True):
            self.stop(run)

    def _heard(self, message_id: str) -> None:
        """On the watch's thread: `message_id` was cancelled; stop its run if it runs here
        (a pending or later delivery of it is refused by the supervisor instead)."""
        for run in self._running():
            if names({message_id}, run.message, started=True):
                self.stop(run)

    def stop(self, run: Run) -> None:
        """Signal a cancelled run to stop, once (from any thread), and kill it after the
        grace."""
        assert run.runner is not None
        with self._pool.live(run.runner, run) as live:
            if not live or run.cancelled or run.interrupted or run.hard_timed_out:
                return
            run.cancelled = True
            run.runner.signal(signal.SIGTERM if run.runner.exec_mode else signal.SIGUSR2)
        log.warning("%s cancelled while running: stopping it (killed in %g s if it has not "
                    "ended)", run.log_label, self.grace)
        self._clock.at(time.monotonic() + self.grace, lambda: self._kill(run))

    def _kill(self, run: Run) -> None:
        """On the clock's thread: the cancelled run outlived its grace."""
        assert run.runner is not None
        with self._pool.live(run.runner, run) as live:
            if live:
                run.runner.signal(signal.SIGKILL)
