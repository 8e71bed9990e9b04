"""The Conveyor queues the Celery intake uses, named in one module that imports nothing.

The intake feeds Celery queue `Q` into Conveyor queue `celery.Q`, and puts the messages it
cannot run on `celery.Q.rejected`, where its outcome loop dead-letters them. The operator
commands (`conveyor status`, `conveyor dead-letters`) derive the rejected queue from the
intake queue a worker registers, without importing the intake (and kombu).
"""

from __future__ import annotations

PREFIX = "celery."
REJECTED = ".rejected"
#: Where the feed puts the messages that start a canvas run (canvas_runs.py), for the
#: outcome loop to create the run from.
CANVAS_QUEUE = "conveyor.celery-canvas"


def intake_queue(celery_queue: str) -> str:
    """The Conveyor queue Celery queue `celery_queue` feeds (never the same name: on a shared
    RabbitMQ a Conveyor quorum queue and Celery's classic queue cannot share one)."""
    return f"{PREFIX}{celery_queue}"


def rejects_queue(celery_queue: str) -> str:
    """Where messages of `celery_queue` that cannot run wait to be dead-lettered."""
    return f"{PREFIX}{celery_queue}{REJECTED}"


def rejects_of(conveyor_queue: str) -> str | None:
    """The rejected queue that goes with intake queue `conveyor_queue`, or None."""
    if conveyor_queue.startswith(PREFIX) and not conveyor_queue.endswith(REJECTED):
        return rejects_queue(conveyor_queue.removeprefix(PREFIX))
    return None
