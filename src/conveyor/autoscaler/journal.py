"""What the autoscaler decided, kept in the state store for the dashboard.

After each evaluation the daemon tells the journal what it saw and chose for the target
(replicas, desired replicas, the load, the reason, an error); when it changed the replica
count, also that change and why. A thread of its own writes them, so a slow or unreachable
store never delays scaling: a failure is logged once, and the record is dropped (the next
one carries the news). Idle cost: a target's row is rewritten only when something in it
changed, or once per `KEEPALIVE` so the dashboard can tell a live autoscaler from one that
stopped; replica changes are kept `RETENTION` seconds.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from conveyor.state.records import Evaluation

if TYPE_CHECKING:
    from conveyor.state.store import Store

log = logging.getLogger("conveyor.autoscaler")

#: Seconds after which an unchanged target's row is written again (its "still here" beat).
KEEPALIVE = 60.0
#: Seconds replica changes are kept.
RETENTION = 7 * 24 * 3600.0
#: Records waiting for the store beyond this many are dropped (the store is stuck).
BACKLOG = 1000

__all__ = ["Evaluation", "Journal"]


class Journal:
    """Writes evaluations and replica changes to the store at `state_url`, off the loop."""

    def __init__(self, state_url: str, clock: Callable[[], float] = time.time) -> None:
        self.state_url = state_url
        self.clock = clock
        self._last: dict[str, tuple[Evaluation, float]] = {}
        self._pending: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(BACKLOG)
        self._store: Store | None = None
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="conveyor-autoscaler-journal",
                                        daemon=True)
        self._thread.start()

    def evaluated(self, evaluation: Evaluation) -> None:
        """Record a target's state if it changed or its keepalive is due (loop thread)."""
        now = self.clock()
        last = self._last.get(evaluation.target)
        if last is not None and last[0] == evaluation and now - last[1] < KEEPALIVE:
            return
        self._last[evaluation.target] = (evaluation, now)
        self._put("evaluated", {**asdict(evaluation), "now": now})

    def scaled(self, target: str, before: int, after: int, reason: str) -> None:
        """Record a replica change the daemon made, and why (loop thread)."""
        self._put("scaled", {"target": target, "from_replicas": before,
                                     "to_replicas": after, "reason": reason,
                                     "now": self.clock()})

    def _put(self, kind: str, params: dict[str, Any]) -> None:
        """Queue a record for the writer thread: `kind` "evaluated" or "scaled"."""
        try:
            self._pending.put_nowait((kind, params))
        except queue.Full:
            log.debug("autoscaler journal: %d records wait for the store; dropped %s",
                      BACKLOG, json.dumps(params))

    def _loop(self) -> None:
        while (item := self._pending.get()) is not None:
            self._write(*item)
        if self._store is not None:
            self._store.close()

    def _write(self, kind: str, params: dict[str, Any]) -> None:
        try:
            store = self._open()
            from conveyor.state.monitoring import Scalers
            scalers = Scalers(store)
            with store.transaction():
                if kind == "scaled":
                    scalers.scaled(**params)
                    scalers.forget_scalings(params["now"] - RETENTION)
                else:
                    scalers.evaluated({k: v for k, v in params.items() if k != "now"},
                                      params["now"])
        except Exception as exc:  # monitoring must never stop scaling
            self._broken(exc)
            return
        if self._failing:
            log.info("autoscaler journal: state store reachable again")
            self._failing = False

    def _open(self) -> Store:
        if self._store is None:
            from conveyor.state import store as stores
            self._store = stores.from_url(self.state_url)
        return self._store

    def _broken(self, exc: Exception) -> None:
        if not self._failing:
            from conveyor.locations import redact
            log.warning("autoscaler journal: cannot record decisions in %s (%s: %s); the "
                        "dashboard shows the last ones it could", redact(self.state_url),
                        type(exc).__name__, exc)
        self._failing = True
        if self._store is not None:
            try:
                self._store.close()
            except Exception as close_exc:  # a broken connection may fail to close too
                log.debug("autoscaler journal: closing failed: %s", close_exc)
        self._store = None

    def close(self, timeout: float = 5.0) -> None:
        """Write what is waiting (for up to `timeout` seconds), then stop."""
        try:
            self._pending.put(None, timeout=timeout)
        except queue.Full:
            log.warning("autoscaler journal: the state store is stuck; %d records were not "
                        "written", BACKLOG)
            return
        self._thread.join(timeout)
