"""Ready messages that a limit blocks, which must not make the autoscaler scale up.

A message whose concurrency key is full cannot start however many workers there are: the
first worker with a free slot to claim it parks it off the queue (worker/flow.py). Until
one does (every slot busy, or between polls) the broker counts it as ready. So for each
queue with ready messages the autoscaler reads the head of the queue (`Broker.peek`, up to
`SAMPLE` messages) and the limits each carries (one header), and with the limiter's usage
counts what could start now: per key no more than its free capacity, min(waiting, max -
in use), a message with several keys only while all have room. Beyond the sample, the
sample's share of unlimited messages is assumed, and of limited ones no more than the room
their keys have left. Messages without limits all count, and so does every
ready message of a transport that cannot look without taking (RabbitMQ, kombu) or when the
limiter cannot be read (logged once): never fewer workers for a limit it cannot see.

Parked messages are not on the queues, so they never count; those a release hands a token
to are published again and count as the ready work they are.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from conveyor.broker import Inspector
from conveyor.flow import LIMITS_HEADER, Spec, decode
from conveyor.limits import Limiter, Usage

log = logging.getLogger("conveyor.autoscaler")
#: Messages read from the head of a queue per evaluation.
SAMPLE = 1000


def limits_in(body: bytes) -> list[Spec]:
    """The concurrency limits a message body carries ([]: none, or unreadable)."""
    try:
        headers = json.loads(body).get("headers") or {}
        return [s for s in decode(headers[LIMITS_HEADER]) if s.kind == "c"] \
            if LIMITS_HEADER in headers else []
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def runnable(sample: Sequence[Sequence[Spec]], ready: int, usage: Mapping[str, Usage]) -> int:
    """Of `ready` messages whose head is `sample` (each message's concurrency limits), how
    many could start now, given each key's usage (a key the store has not seen is free).

    Beyond the sample, messages without limits are assumed at the sample's share of them,
    and limited ones at most the room their keys still have after the sample: 10,000
    messages of one key with max=2 are 2 that could start, not 10,000 x 2 / 1,000."""
    if not sample:
        return ready
    free: dict[str, int] = {}
    count = unlimited = 0
    for specs in sample:
        unlimited += not specs
        for s in specs:
            if s.key not in free:
                u = usage.get(s.key)
                limit = u.max if u is not None and u.max is not None else s.max
                free[s.key] = limit - (u.in_use if u is not None else 0)
        if all(free[s.key] >= s.weight for s in specs):
            count += 1
            for s in specs:
                free[s.key] -= s.weight
    rest = ready - len(sample)
    if rest <= 0:
        return count
    limited = rest * (len(sample) - unlimited) // len(sample)
    room = sum(max(0, left) for left in free.values())
    return count + round(rest * unlimited / len(sample)) + min(limited, room)


class Blocked:
    """Counts the runnable part of a queue's ready messages; the limiter is opened on the
    first sample holding a limited message (a fleet without limits never touches it)."""

    def __init__(self, open_limiter: Callable[[], Limiter] | None) -> None:
        self._open = open_limiter
        self._limiter: Limiter | None = None
        self._failing = False

    def ready(self, broker: Inspector, queue: str, ready: int) -> int:
        """The ready messages of `queue` that could start now (see the module docstring)."""
        if ready <= 0 or self._open is None:
            return ready
        bodies = broker.peek(queue, SAMPLE)
        if not bodies:
            return ready
        sample = [limits_in(body) for body in bodies]
        if not any(sample):
            return ready
        usage = self._usage()
        return ready if usage is None else runnable(sample, ready, usage)

    def _usage(self) -> dict[str, Usage] | None:
        try:
            if self._limiter is None:
                assert self._open is not None
                self._limiter = self._open()
            usage = {u.key: u for u in self._limiter.usage(time.time())}
        except Exception as exc:  # noqa: BLE001 - the limiter store's own errors
            if not self._failing:
                log.error("cannot read the limits' usage (%s: %s); counting every ready "
                          "message as runnable until it can be read", type(exc).__name__, exc)
            self._failing = True
            return None
        if self._failing:
            log.info("the limits' usage is readable again")
            self._failing = False
        return usage

    def close(self) -> None:
        if self._limiter is not None:
            self._limiter.close()
