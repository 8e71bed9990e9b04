"""The broker as each caller sees it: four narrow roles over the one `Broker` class.

`Broker` (base.py) is what a transport implements; nobody above the broker layer needs all of
it. Each caller names the role it uses, so a reader sees at the signature what a component
may do to the queues, and a test double need only offer that much:

* `Producer`: publishing (the client, the Celery intake's feeds, the scheduler's executors);
* `Consumer`: consuming and settling what was consumed (the worker, the scheduler daemon, the
  Celery intake's outcomes). A consumer publishes too, on its own connection: a worker's
  task events and parked messages, the scheduler's follow-ups;
* `Inspector`: depth, the head of a queue, emptiness and `watch` (the autoscaler, the queue
  sampler): it never takes a message;
* `Administrator`: an operator's view and hands (the CLI and the dashboard): what an
  inspector sees, plus the dead letters of every queue to list, re-queue or delete.

They are Protocols: every `Broker` is each of them (checked by mypy below), and the semantics
of each method are written once, on `Broker`. `conveyor.broker.from_url` opens a `Broker`;
hand it on as the role the receiver needs.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Protocol

from conveyor.broker.base import DeadLetter, Delivery, Depth, Publication

if TYPE_CHECKING:
    from conveyor.broker.base import Broker


class Producer(Protocol):
    """Publishes messages (see `Broker.publish`, `Broker.publish_many`)."""

    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None: ...

    def publish_many(self, publications: Sequence[Publication]) -> None: ...

    def close(self) -> None: ...


class Consumer(Producer, Protocol):
    """Consumes, holds and settles deliveries (see `Broker.consume` and the settling methods
    there); asks whether its own queues are drained (a `--burst` worker is then done)."""

    lease_seconds: float
    weaker_guarantees: str
    leases: bool

    @property
    def fence_seconds(self) -> float: ...

    def consume(self, queues: Sequence[str], *, prefetch: int = 1, timeout: float = 1.0,
                ahead: int = 0) -> Generator[Delivery | None, float | None, None]: ...

    def claim_more(self, queues: Sequence[str], limit: int) -> list[Delivery]: ...

    @property
    def claimed_ahead(self) -> int: ...

    def renew_claimed(self, seconds: float | None = None) -> None: ...

    @property
    def outstanding(self) -> int: ...

    def ack(self, delivery: Delivery) -> None: ...

    def ack_soon(self, delivery: Delivery) -> None: ...

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[Delivery]: ...

    @property
    def owed_for(self) -> float | None: ...

    def send_owed(self) -> bool: ...

    def give_back_claimed(self) -> None: ...

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None: ...

    def dead_letter(self, delivery: Delivery, reason: str) -> None: ...

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None: ...

    def is_empty(self, queues: Sequence[str]) -> bool: ...

    def pause(self, *, wake: bool = True) -> None: ...

    def wakeup(self) -> None: ...

    def stop_retrying(self, *, wake: bool = True) -> None: ...

    def hold_connections_with(self, hold: Callable[[socket.socket], None]) -> None: ...


class Inspector(Protocol):
    """Reads how much work queues hold without taking any (see `Broker.depth`, `peek`,
    `is_empty`, `watch`); `wakeup` ends a `watch` early."""

    def depth(self, queue: str) -> Depth: ...

    def peek(self, queue: str, limit: int) -> list[bytes] | None: ...

    def is_empty(self, queues: Sequence[str]) -> bool: ...

    def watch(self, queues: Sequence[str], timeout: float, *, above: int = 0) -> bool: ...

    def wakeup(self) -> None: ...

    def close(self) -> None: ...


class Administrator(Inspector, Producer, Protocol):
    """An operator's broker: inspects queues and administers dead letters (see the admin
    methods of `Broker`). It publishes too: re-queueing a dead letter with a fresh retry
    budget publishes a new copy of it."""

    def dead_queues(self) -> list[str]: ...

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]: ...

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int: ...

    def purge(self, queue: str) -> int: ...

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int: ...


if TYPE_CHECKING:
    def _every_broker_plays_every_role(
            broker: Broker) -> tuple[Producer, Consumer, Inspector, Administrator]:
        """mypy fails here if `Broker` stops matching a role."""
        return broker, broker, broker, broker
