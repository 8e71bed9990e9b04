"""Which queues are worth showing, and their depth now."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from conveyor.broker import Administrator
from conveyor.celery_intake.names import rejects_of
from conveyor.errors import BrokerError
from conveyor.scheduler.config import CONTROL_QUEUE
from conveyor.scheduler.engine import EVENTS_QUEUE
from conveyor.scheduler.sampler import queues_to_sample
from conveyor.state.store import Store

log = logging.getLogger("conveyor.readers")

#: Queues always worth showing: the usual work queue and the scheduler's own.
ALWAYS = ("default", EVENTS_QUEUE, CONTROL_QUEUE)


def known_queues(store: Store | None, extra: Sequence[str] = (),
                 broker: Administrator | None = None) -> list[str]:
    """Queues named by flags, registered workers and recent runs, plus the usual ones, and
    (given the broker) every queue holding dead letters.

    Brokers cannot list their queues portably, so status and dead-letter commands look at
    the queues someone uses; `--queue` adds any other. A worker with `--celery-queues`
    registers the intake queues, which bring their rejected queues (while it runs). Dead
    letters are listed by the broker itself: a queue no live worker consumes keeps its
    dead letters, and an operator must see them without knowing its name.
    """
    found = [*extra, *ALWAYS]
    if store is not None:
        found = queues_to_sample(store, found)   # the scheduler samples the same ones
    if broker is not None:
        found += _dead_queues(broker)
    return list(dict.fromkeys(q for q in _with_rejects(found) if q))


def _dead_queues(broker: Administrator) -> list[str]:
    """The broker's queues holding dead letters; when it cannot say (RabbitMQ without its
    management API), a warning says the listing is partial, and the rest still shows."""
    try:
        return broker.dead_queues()
    except BrokerError as exc:
        log.warning("queues holding dead letters are not all listed (pass them with -Q): %s",
                    exc)
        return []


def _with_rejects(queues: Sequence[str]) -> list[str]:
    """Each queue, followed by the Celery intake's rejected queue when it is an intake queue:
    the messages the intake could not run are dead letters there, and nobody should have to
    know that queue's name to see them."""
    found: list[str] = []
    for queue in queues:
        rejects = rejects_of(queue)
        found += [queue, rejects] if rejects else [queue]
    return found


def queue_rows(broker: Administrator, names: list[str]) -> list[dict[str, Any]]:
    """Each queue's depth now: ready, in flight, delayed and dead."""
    rows = []
    for name in names:
        d = broker.depth(name)
        rows.append({"queue": name, "ready": d.ready, "in_flight": d.in_flight,
                     "delayed": d.delayed, "dead": d.dead})
    return rows
