"""The supervisor's side of flow control: admit a limited delivery before it takes a slot.

A message without limits never reaches this module's store (the limiter is opened on the
first limited message). A limited one is admitted through `Limiter.admit` when it is
accepted, before it is handed to a runner:

* granted: it runs, holding its concurrency tokens under its message id; they are renewed
  with the worker's heartbeat and released when the message is settled;
* parked: its key is full; the limiter keeps it in the key's waiting area and the delivery
  is acked off the broker, so it takes no slot and nobody spins on it;
* delayed: its rate key has no token now; it is published again with the delay its
  reservation says, marked reserved so that it is not counted twice, and acked.

A release hands the freed token to the oldest parked message of the key, which is published
again (first) and then forgotten by the limiter (second): at-least-once, never loss. An idle
worker sweeps now and then, so tokens of a worker killed with -9 return when their lease
lapses and the messages waiting for them move on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from conveyor.broker import Broker, Delivery
from conveyor.flow import RATE_RESERVED_HEADER, Spec
from conveyor.limits import Limiter, Parcel, Usage
from conveyor.message import Codec, Message

log = logging.getLogger("conveyor.worker")


class Gate:
    """Admission, release, renewal and sweeping for one supervisor (main thread only)."""

    def __init__(self, open_limiter: Callable[[], Limiter], broker: Broker, codec: Codec,
                 on_denied: Callable[[str, str], None] | None = None,
                 on_usage: Callable[[list[Usage]], None] | None = None) -> None:
        self._open = open_limiter
        self.broker = broker
        self.codec = codec
        self.limiter: Limiter | None = None
        self.lease = broker.lease_seconds
        self._on_denied = on_denied or (lambda key, verdict: None)
        self._on_usage = on_usage
        self._next_sweep = 0.0

    def _store(self) -> Limiter:
        if self.limiter is None:
            self.limiter = self._open()
        return self.limiter

    def admit(self, delivery: Delivery, message: Message, specs: Sequence[Spec]) -> bool:
        """Whether the delivery may run now; if not, it has been parked or delayed and acked."""
        parcel = Parcel(message.id, delivery.queue, delivery.body, delivery.priority)
        reserved = message.headers.get(RATE_RESERVED_HEADER) == str(message.attempt)
        decision = self._store().admit(parcel, specs, time.time(), self.lease,
                                       rate_reserved=reserved)
        if decision.granted:
            return True
        if decision.verdict == "delayed":
            marked = replace(message, headers={**message.headers,
                                               RATE_RESERVED_HEADER: str(message.attempt)})
            self.broker.publish(delivery.queue, self.codec.encode(marked),
                                priority=delivery.priority, delay=decision.delay)
            log.debug("%s delayed %.3fs by its rate limit", message.id, decision.delay)
        self._on_denied(decision.key, decision.verdict)
        self.broker.ack_soon(delivery)  # kept or re-published first: the ack may ride along
        return False

    def release(self, holder: str, specs: Sequence[Spec]) -> None:
        """Give back `holder`'s tokens and move on the messages they were handed to."""
        try:
            self._forward(self._store().release(holder, specs, time.time(), self.lease))
        except Exception as exc:  # noqa: BLE001 - the store's own errors; the lease still lapses
            log.warning("could not release the limits of %s (%s); they return when their "
                        "lease lapses", holder, exc)

    def renew(self, held: Sequence[tuple[str, Sequence[Spec]]]) -> None:
        if held:
            self._store().renew(held, time.time(), self.lease)

    def tick(self, now: float) -> None:
        """Sweep lapsed tokens and lost hand-overs, at most every third of a lease, once
        this worker has seen a limited message."""
        if self.limiter is None or now < self._next_sweep:
            return
        self._next_sweep = now + max(0.5, self.lease / 3)
        self._forward(self.limiter.sweep(time.time(), self.lease))
        if self._on_usage is not None:
            self._on_usage(self.limiter.usage(time.time()))

    def waiting(self) -> int:
        """Messages parked in the store (a draining --burst worker waits for them)."""
        if self.limiter is None:
            return 0
        return sum(u.waiting for u in self.limiter.usage(time.time()))

    def _forward(self, parcels: list[Parcel]) -> None:
        """Publish handed-over messages, then tell the store they are out (in that order)."""
        for p in parcels:
            self.broker.publish(p.queue, p.body, priority=p.priority)
        if parcels:
            assert self.limiter is not None
            self.limiter.moved([p.id for p in parcels])

    def close(self) -> None:
        if self.limiter is not None:
            self.limiter.close()
