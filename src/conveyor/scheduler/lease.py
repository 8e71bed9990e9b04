"""A scheduler's lease in the state store: how the others tell it is alive.

A scheduler claims a task instance's attempt for publishing in one transaction (state
`queued`, `claimed_by` its id) and publishes it just after; if it is killed in between, the
attempt waits on a claimer that will never publish it. Its lease says when to stop waiting:
a thread of its own, on a store connection of its own, renews the row a third of a lease
apart, so a live scheduler keeps it whatever its main loop is doing (a long batch, a broker
call retrying through an outage), and a dead one's lapses `lease` seconds after its last
renewal at most. Another scheduler then claims those attempts and publishes them
(`Engine._claim_unpublished`); while the claimer's lease holds, nobody else does.

Each renewal also reads the store's earliest deadline and hands it to `wake`: a claim made
by another scheduler since this one last ticked would otherwise wait for its idle tick.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from conveyor.state.kept import KeptStore
from conveyor.state.monitoring import Schedulers
from conveyor.state.store import Store
from conveyor.state.tasks import TaskInstances

log = logging.getLogger("conveyor.scheduler")
#: Rows of schedulers whose lease lapsed this long ago are deleted (killed long ago).
FORGET_AFTER = 3600.0


class SchedulerLease:
    """Keeps scheduler `scheduler_id`'s lease fresh until `close()`."""

    def __init__(self, state_url: str, scheduler_id: str, lease: float,
                 wake: Callable[[float | None], None] = lambda at: None,
                 clock: Callable[[], float] = time.time) -> None:
        self.lease = lease
        self.row: dict[str, Any] = {"scheduler": scheduler_id, "hostname": socket.gethostname(),
                    "pid": os.getpid()}
        self._wake = wake
        self._clock = clock
        self._store = KeptStore(state_url, log, "scheduler lease", "renew it",
                                "if it lapses, other schedulers publish what this one claimed")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SchedulerLease:
        """Take the lease now (before anything is claimed under it), then keep it."""
        self.renew()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="conveyor-scheduler-lease")
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.lease / 3):
            self.renew()

    def renew(self) -> None:
        """Extend the lease, then hand the earliest deadline to `wake`; a store that cannot
        be reached is logged (once) and tried again: the main loop cannot claim anything
        meanwhile either."""
        found = self._store.use(self._renew)
        if found is not None:
            self._wake(found[0])

    def _renew(self, store: Store) -> tuple[float | None]:
        now = self._clock()
        schedulers = Schedulers(store)
        with store.transaction():
            schedulers.renew(**self.row, now=now, lease=self.lease)
            schedulers.forget_lapsed(now, FORGET_AFTER)
        return (TaskInstances(store).next_deadline(),)

    def close(self) -> None:
        """Stop renewing and give the lease up: what this scheduler claimed and did not
        publish (it stopped on an error mid-dispatch) is taken over at once, not a lease
        later."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._store.use(lambda store: Schedulers(store).forget(self.row["scheduler"]))
        self._store.close()
