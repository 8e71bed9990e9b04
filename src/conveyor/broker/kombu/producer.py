"""Publishing through kombu: now, or into a delay level stamped with its due time."""

from __future__ import annotations

import time
import uuid
from typing import Any

from conveyor.broker.bands import priority_headers
from conveyor.broker.kombu.connection import KombuConnection
from conveyor.broker.kombu.settings import (
    DELIVERIES_HEADER,
    DUE_HEADER,
    ID_HEADER,
    level_floor,
    level_of,
)


class KombuProducer(KombuConnection):
    """Publishing."""

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        headers = {ID_HEADER: uuid.uuid4().hex, DELIVERIES_HEADER: 0,
                   **priority_headers(priority)}
        self._call(f"publish to queue {queue!r}", lambda: self._place(queue, body, headers,
                                                                       delay))

    def _place(self, queue: str, body: bytes, headers: dict[str, Any], delay: float) -> None:
        """Send to the queue, or to its delay level stamped with the due time."""
        if delay <= 0:
            self._send(self._name(queue), body, headers, main=True)
            return
        due = time.time() + delay
        level = level_of(delay)
        self._send(self._level_name(queue, level), body, {**headers, DUE_HEADER: repr(due)})
        key = (queue, level)
        if key in self._next_look:  # we consume it: look again when it must move
            self._next_look[key] = min(self._next_look[key],
                                       time.monotonic() + delay - level_floor(level))
