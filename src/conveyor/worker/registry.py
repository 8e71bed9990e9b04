"""The worker registry: who is consuming what, how busy, and who went quiet.

Each `conveyor worker` upserts one row in the state store (the scheduler's database: the one
store every deployment already shares, whatever the broker) every heartbeat interval, from a
thread of its own so a slow database never delays a task; a clean stop deletes the row.
`conveyor status` reads the rows and marks a worker *stale* when its last heartbeat is older
than `STALE_AFTER` intervals: killed, frozen, or cut off from the database. Each beat also
carries what every runner slot holds (task, memory charged to its lane against its cap), for
the dashboard's Workers page.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # imported when the first heartbeat opens it, not when the worker starts
    from conveyor.state.store import Store

log = logging.getLogger("conveyor.worker")

#: Heartbeat intervals without a beat before a worker is shown as stale.
STALE_AFTER = 3
#: Rows of workers silent this long (seconds) are forgotten.
FORGET_AFTER = 24 * 3600.0


@dataclass(frozen=True)
class WorkerRecord:
    """One worker's last heartbeat, as `conveyor status` shows it."""

    worker_id: str
    hostname: str
    pid: int
    queues: str
    concurrency: int
    busy: int
    interval: float
    started_at: float
    heartbeat_at: float
    #: {"limiter": kind, "slots": [{"slot", "task", "memory", "limit", ...}],
    #: "finished": {queue: [succeeded, failed] since it started}}, or None from a worker
    #: that reports no runners
    runners: dict[str, Any] | None = None

    @property
    def free(self) -> int:
        return max(0, self.concurrency - self.busy)

    def stale(self, now: float) -> bool:
        return now - self.heartbeat_at > STALE_AFTER * self.interval


def workers(store: Store) -> list[WorkerRecord]:
    """Every registered worker."""
    return [WorkerRecord(**{**row, "runners": json.loads(row["runners"]) if row.get("runners")
                            else None}) for row in store.rows("workers")]


class Registry:
    """Keeps this worker's row fresh until `close()`."""

    def __init__(self, state_url: str, hostname: str, queues: Sequence[str], concurrency: int,
                 interval: float, clock: Callable[[], float] = time.time) -> None:
        self.url = state_url
        self.interval = interval
        self.clock = clock
        self.row = {"worker_id": f"{hostname}:{os.getpid()}", "hostname": hostname,
                    "pid": os.getpid(), "queues": ",".join(queues),
                    "concurrency": concurrency, "interval": interval, "started_at": clock()}
        self._store: Store | None = None
        self._failing = False
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
        try:
            store = self._open()
            now = self.clock()
            with store.transaction():
                store.exec("upsert_worker", **self.row, busy=busy, now=now,
                           runners=json.dumps(runners) if runners is not None else None)
                store.exec("forget_workers", now=now, older_than=FORGET_AFTER)
        except Exception as exc:  # monitoring must never stop work
            self._broken(exc)
            return
        if self._failing:
            log.info("worker registry: state store reachable again")
            self._failing = False

    def _open(self) -> Store:
        if self._store is None:
            from conveyor.state import store as stores
            self._store = stores.from_url(self.url)
        return self._store

    def _broken(self, exc: Exception) -> None:
        if not self._failing:
            from conveyor.locations import redact
            log.warning("worker registry: cannot write this worker's heartbeat to %s "
                        "(%s: %s); `conveyor status` will show it stale until it can",
                        redact(self.url), type(exc).__name__, exc)
        self._failing = True
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # a broken connection may fail to close too
                pass
        self._store = None

    def close(self) -> None:
        """Stop beating and delete the row: a worker that stopped cleanly is not stale."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        try:
            store = self._open()
            store.exec("delete_worker", worker_id=self.row["worker_id"])
            store.close()
        except Exception as exc:
            log.warning("worker registry: could not remove this worker's row: %s", exc)


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


def state_url_for(broker_url: str, state_url: str) -> str | None:
    """Where a worker registers: the configured state store; with neither a broker nor a
    state store configured (the embedded default), the default one. A worker given only a
    broker URL does not register: its state store would be a file no one else reads.
    (`state.store.monitoring_url` is the same rule for the other daemons; this copy keeps a
    worker without a state store from importing the store at all.)"""
    if state_url:
        return state_url
    if broker_url:
        return None
    from conveyor.state.store import default_url
    return default_url()
