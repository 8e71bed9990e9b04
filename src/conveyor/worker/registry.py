"""The worker registry: who is consuming what, how busy, and who went quiet.

Each `conveyor worker` upserts one row in the state store (the scheduler's database: the one
store every deployment already shares, whatever the broker) every heartbeat interval, from a
thread of its own so a slow database never delays a task; a clean stop deletes the row.
`conveyor status` reads the rows and marks a worker *stale* when its last heartbeat is older
than `state.records.STALE_AFTER` intervals: killed, frozen, or cut off from the database.
Each beat also carries what every runner slot holds (task, memory charged to its lane
against its cap), for the dashboard's Workers page.

Monitoring must never stop work: a store that cannot be reached is logged once and tried
again at the next beat.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # imported when the first heartbeat opens it, not when the worker starts
    from conveyor.state.store import Store

log = logging.getLogger("conveyor.worker")

#: Rows of workers silent this long (seconds) are forgotten.
FORGET_AFTER = 24 * 3600.0


class Registry:
    """Keeps this worker's row fresh until `close()`."""

    def __init__(self, state_url: str, hostname: str, queues: Sequence[str], concurrency: int,
                 interval: float, clock: Callable[[], float] = time.time, *,
                 code_version: str = "") -> None:
        self.url = state_url
        self.interval = interval
        self.clock = clock
        self.row: dict[str, Any] = {"worker_id": f"{hostname}:{os.getpid()}", "hostname": hostname,
                    "pid": os.getpid(), "queues": ",".join(queues),
                    "concurrency": concurrency, "interval": interval, "started_at": clock(),
                    "code_version": code_version}
        from conveyor.state.kept import KeptStore  # with the registry, not the worker's import
        self._store = KeptStore(state_url, log, "worker registry", "write this worker's "
                                "heartbeat", "`conveyor status` will show it stale until it can")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, busy: Callable[[], int],
              runners: Callable[[], dict[str, Any]] | None = None) -> Registry:
        """Beat now and then every interval; `busy()` is the number of held deliveries,
        `runners()` what each runner slot holds (see `WorkerRecord.runners`)."""
        self._thread = threading.Thread(target=self._loop, args=(busy, runners), daemon=True,
                                        name="conveyor-worker-registry")
        self._thread.start()
        return self

    def _loop(self, busy: Callable[[], int],
              runners: Callable[[], dict[str, Any]] | None) -> None:
        while True:
            self.beat(busy(), _safely(runners))
            if self._stop.wait(self.interval):
                return

    def beat(self, busy: int, runners: dict[str, Any] | None = None) -> None:
        """Upsert the row; log (once) and carry on if the store cannot be reached."""
        def upsert(store: Store) -> None:
            from conveyor.state.monitoring import Workers
            now, registry = self.clock(), Workers(store)
            with store.transaction():
                registry.beat(**self.row, busy=busy, now=now,
                              runners=json.dumps(runners) if runners is not None else None)
                registry.forget_silent(now, FORGET_AFTER)
        self._store.use(upsert)

    def close(self) -> None:
        """Stop beating and delete the row: a worker that stopped cleanly is not stale."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        self._store.use(self._delete)
        self._store.close()

    def _delete(self, store: Store) -> None:
        from conveyor.state.monitoring import Workers
        Workers(store).delete(self.row["worker_id"])


def _safely(runners: Callable[[], dict[str, Any]] | None) -> dict[str, Any] | None:
    """What the runners hold; None (and a debug line) if it cannot be read this beat: the
    heartbeat itself must go out."""
    if runners is None:
        return None
    try:
        return runners()
    except Exception as exc:  # monitoring must never stop the heartbeat
        log.debug("worker registry: cannot read the runners' memory: %s", exc)
        return None
