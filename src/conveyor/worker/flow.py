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

A parked delivery says its key is full, so the queue likely holds more of that key behind
it: `park_behind` claims the queue a batch at a time (`Broker.claim_more`), parks every
message of a full key in one limiter call (`Limiter.park_many`, stored first) and acks them
(second: a crash between the two redelivers them, and a message id is parked only once).
It stops at the first batch holding something that may run: another key's message behind a
backlog of thousands is reached in a few batches, not thousands of claims.

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

from conveyor.broker import Consumer, Delivery
from conveyor.errors import MessageError
from conveyor.flow import RATE_RESERVED_HEADER, Spec
from conveyor.limits import Limiter, Parcel, Usage
from conveyor.message import Codec, Message
from conveyor.worker.observers import Observer
from conveyor.worker.run import Run

log = logging.getLogger("conveyor.worker")
#: Deliveries claimed at once behind a full key: one limiter transaction parks them all.
PARK_BATCH = 100
#: How long one `park_behind` may go on before the supervisor looks at its runs again.
PARK_SECONDS = 0.5


class Gate(Observer):
    """Admission, release, renewal and sweeping for one supervisor (main thread only).

    The supervisor asks it to admit a limited delivery and to park what waits behind a
    full key; the rest it hears as an observer of each run's life (worker/observers.py):
    tokens released with the run, renewed every heartbeat, swept on the loop's ticks.
    It reports `parked` and `unparked` lifecycle events through `tell` (the supervisor's,
    to its observers), after the store and the broker have the message."""

    def __init__(self, open_limiter: Callable[[], Limiter], broker: Consumer, codec: Codec,
                 on_denied: Callable[[str, str], None] | None = None,
                 on_usage: Callable[[list[Usage]], None] | None = None) -> None:
        self._open = open_limiter
        self.broker = broker
        self.codec = codec
        self.limiter: Limiter | None = None
        self.lease = broker.lease_seconds
        self._on_denied = on_denied or (lambda key, verdict: None)
        self._on_usage = on_usage
        #: (kind, message, queue, **fields) of a lifecycle event: set by the supervisor
        self.tell: Callable[..., None] = lambda kind, message, queue, **fields: None
        self._next_sweep = 0.0

    def _store(self) -> Limiter:
        if self.limiter is None:
            self.limiter = self._open()
        return self.limiter

    def admit(self, delivery: Delivery, message: Message, specs: Sequence[Spec]) -> str:
        """"run" if the delivery may run now; else "parked" or "delayed", and it was acked."""
        parcel = Parcel(message.id, delivery.queue, delivery.body, delivery.priority)
        reserved = message.headers.get(RATE_RESERVED_HEADER) == str(message.attempt)
        decision = self._store().admit(parcel, specs, time.time(), self.lease,
                                       rate_reserved=reserved)
        if decision.granted:
            return decision.verdict
        if decision.verdict == "delayed":
            marked = replace(message, headers={**message.headers,
                                               RATE_RESERVED_HEADER: str(message.attempt)})
            self.broker.publish(delivery.queue, self.codec.encode(marked),
                                priority=delivery.priority, delay=decision.delay)
            log.debug("%s delayed %.3fs by its rate limit", message.id, decision.delay)
        self._on_denied(decision.key, decision.verdict)
        self.broker.ack_soon(delivery)  # kept or re-published first: the ack may ride along
        if decision.verdict == "parked":
            self._parked(message, delivery.queue, decision.key)
        return decision.verdict

    def park_behind(self, queues: Sequence[str],
                    vet: Callable[[Delivery], tuple[Message, Sequence[Spec]] | None]
                    ) -> list[Delivery]:
        """Park the full keys' messages waiting on `queues`, a batch at a time (see the
        module docstring); the deliveries left alone, in claim order, for the caller to
        handle as usual. `vet` gives a delivery's message and limits, or None for one that
        must not be parked here (unreadable, unlimited, over its delivery cap...)."""
        left: list[Delivery] = []
        deadline = time.monotonic() + PARK_SECONDS
        while not left and time.monotonic() < deadline:
            batch = self.broker.claim_more(queues, PARK_BATCH)
            vetted = [(d, v) for d in batch if (v := vet(d)) is not None]
            try:
                parked = self._park_many([(d, m, specs) for d, (m, specs) in vetted])
            except Exception as exc:  # noqa: BLE001 - the store's or the broker's own errors
                log.warning("could not park a batch of %d behind a full key (%s: %s); each "
                            "is handled on its own", len(batch), type(exc).__name__, exc)
                return batch  # parked ones among them are parked once, acked again
            left = [d for d in batch if id(d) not in parked]
            if len(batch) < PARK_BATCH:
                break
        return left

    def _park_many(self, batch: Sequence[tuple[Delivery, Message, Sequence[Spec]]]
                   ) -> set[int]:
        """Park those of `batch` whose key is full, then ack them; their `id()`s."""
        if not batch:
            return set()
        keys = self._store().park_many(
            [(Parcel(m.id, d.queue, d.body, d.priority), specs) for d, m, specs in batch],
            time.time())
        parked = [(delivery, message, key) for (delivery, message, _), key
                  in zip(batch, keys, strict=True) if key]
        for delivery in self.broker.ack_many([d for d, _, _ in parked]):
            log.warning("a parked message of %s was no longer ours to ack (its lease lapsed);"
                        " its redelivery is parked only once", delivery.queue)
        for delivery, message, key in parked:
            self._on_denied(key, "parked")
            self._parked(message, delivery.queue, key)
        if parked:
            log.debug("parked %d of %d claimed behind a full key", len(parked), len(batch))
        return {id(delivery) for delivery, _, _ in parked}

    def release(self, holder: str, specs: Sequence[Spec]) -> None:
        """Give back `holder`'s tokens and move on the messages they were handed to."""
        try:
            self._forward(self._store().release(holder, specs, time.time(), self.lease))
        except Exception as exc:  # noqa: BLE001 - the store's own errors; the lease still lapses
            log.warning("could not release the limits of %s (%s); they return when their "
                        "lease lapses", holder, exc)

    def unhold(self, key: str, holder: str) -> None:
        """Give back the unique key `holder` held until its outcome (`UNIQUE_HEADER`)."""
        try:
            self._store().unhold(key, holder)
        except Exception as exc:  # noqa: BLE001 - the store's own errors; the hold still ends
            log.warning("could not give back unique key %r of %s (%s: %s); it is held until "
                        "its time to live runs out", key, holder, type(exc).__name__, exc)

    def renew(self, held: Sequence[tuple[str, Sequence[Spec]]]) -> None:
        if held:
            self._store().renew(held, time.time(), self.lease)

    # -- as an observer of each run ---------------------------------------------------------

    def released(self, run: Run) -> None:
        if run.limits:
            self.release(run.message.id, run.limits)

    def heartbeat(self, runs: Sequence[Run]) -> None:
        """Renew the tokens the runs hold, as their leases are extended."""
        held = [(r.message.id, r.limits) for r in runs if r.limits]
        if not held:
            return
        try:
            self.renew(held)
        except Exception as exc:  # noqa: BLE001 - the limiter store's own errors
            log.warning("could not renew limit tokens (%s); they lapse with the lease", exc)

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
        bodies = [self._queued_again(p.body) for p in parcels]
        for p, body in zip(parcels, bodies, strict=True):
            self.broker.publish(p.queue, body, priority=p.priority)
        if parcels:
            assert self.limiter is not None
            self.limiter.moved([p.id for p in parcels])
        for p, body in zip(parcels, bodies, strict=True):
            self._unparked(body, p.queue)

    def _parked(self, message: Message, queue: str, key: str) -> None:
        """Tell the message's reply_to that it waits for a slot of `key` (a scheduler then
        stops its queued timeout, as Airflow's does for a task waiting for a pool)."""
        self.tell("parked", message, queue, reason=f"waiting for a slot of {key}")

    def _unparked(self, body: bytes, queue: str) -> None:
        """Tell the reply_to of a message handed a slot that it is queued again."""
        try:
            message = self.codec.decode(body)
        except MessageError:
            return  # it was parked, so it was read once; a worker that claims it says more
        self.tell("unparked", message, queue)

    def _queued_again(self, body: bytes) -> bytes:
        """A parked message handed its slot: its deadline to start (`Message.expires`)
        starts over now, as the scheduler's queued timeout does on `unparked`. Waiting for
        a slot is not waiting in the queue."""
        try:
            message = self.codec.decode(body)
        except MessageError:
            return body  # it was read when parked; whoever claims it dead-letters it
        return self.codec.encode(message.queued_again(time.time())) if message.expires \
            else body

    def close(self) -> None:
        if self.limiter is not None:
            self.limiter.close()
