"""A state store connection kept by a background thread whose work must never stop its
process (a worker's heartbeat row, a scheduler's lease): opened on first use, dropped after
an error so the next use opens a fresh one, and the error logged once until the store
answers again. The store module is imported on first use, not when a worker starts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from conveyor.locations import redact

if TYPE_CHECKING:
    from conveyor.state.store import Store

T = TypeVar("T")


class KeptStore:
    """`use(step)` runs `step(store)` on the kept connection; see the module docstring."""

    def __init__(self, url: str, log: logging.Logger, name: str, doing: str,
                 meanwhile: str) -> None:
        self.url = url
        self._log = log
        #: for the log lines: "<name>: cannot <doing> in <url> (<error>); <meanwhile>"
        self._name, self._doing, self._meanwhile = name, doing, meanwhile
        self._store: Store | None = None
        #: whether the last use failed (logged once, until a use works again)
        self.failing = False

    def use(self, step: Callable[[Store], T]) -> T | None:
        """`step(store)`'s value; None if the store failed (logged once, never raised)."""
        try:
            found = step(self._open())
        except Exception as exc:  # noqa: BLE001 - the store's own errors; tried again next use
            self._broken(exc)
            return None
        if self.failing:
            self._log.info("%s: state store reachable again", self._name)
            self.failing = False
        return found

    def _open(self) -> Store:
        if self._store is None:
            from conveyor.state import store as stores
            self._store = stores.from_url(self.url)
        return self._store

    def _broken(self, exc: Exception) -> None:
        if not self.failing:
            self._log.warning("%s: cannot %s in %s (%s: %s); %s", self._name, self._doing,
                              redact(self.url), type(exc).__name__, exc, self._meanwhile)
        self.failing = True
        self.close()

    def close(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close too
                pass
        self._store = None
