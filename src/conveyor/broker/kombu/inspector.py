"""Depth through kombu: ready and dead counts from declares, in flight this object's own."""

from __future__ import annotations

from conveyor.broker.base import Depth
from conveyor.broker.kombu.consumer import KombuConsumer
from conveyor.broker.kombu.settings import SETTLE, TOP_LEVEL


class KombuInspector(KombuConsumer):
    """Depth."""

    def depth(self, queue: str) -> Depth:
        """Counts from `queue_declare`; in flight: what this object holds (module docstring).

        When this object consumes `queue`, messages already on their way to it (pushed by
        AMQP, or popped by a BRPOP whose reply is unread) are in neither count: it first
        waits up to `SETTLE` seconds for them to land, so a draining `--burst` worker does
        not take the in-transit message for an empty queue.
        """
        sub = self._sub
        if sub is not None and queue in sub.buffers:
            try:
                sub.drain(SETTLE)
            except self._errors as exc:
                self._consumer_failed(f"measuring the depth of {queue!r}", exc)

        def count() -> Depth:
            ready = self._declare(self._name(queue), main=True)
            dead = self._declare(self._name(queue, ".dead"))
            delayed = sum(self._declare(self._level_name(queue, k))
                          for k in range(TOP_LEVEL + 1))
            sub = self._sub
            buffered = len(sub.buffers.get(queue, ())) if sub else 0
            held = sum(1 for r in self._live if r.queue == queue)
            return Depth(ready, buffered + held, delayed, dead)
        return self._call(f"measuring the depth of queue {queue!r}", count)
