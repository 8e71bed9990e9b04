"""The outcome loop: results back to Celery's backend, rejected messages to dead letters.

One consumer on Conveyor's own broker reads two kinds of queues:

* `conveyor.celery-results`: the outcome events the worker publishes for Celery-born
  messages (their `reply_to`, set only when a result backend is configured). Succeeded and
  dead-lettered events become Celery result documents (`results.py`); the next step of a
  chain or a chord's callback is published (`canvas.py`); the event is acked after both,
  so a crash does them again rather than never.
* `celery.<queue>.rejected`: rejection records from the feed. Each is dead-lettered with the
  reason it carries (so `conveyor queues` lists it under that queue's dead letters, body
  kept), and its producer's `get()` is told FAILURE or REVOKED instead of waiting forever.
  The reason travels inside the record because the seam can only dead-letter a delivery.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Generator

from conveyor.broker import Consumer, Delivery
from conveyor.celery_intake.canvas import Follower
from conveyor.celery_intake.results import Outcomes, RedisResults, rejected
from conveyor.errors import LeaseLost, MessageError
from conveyor.events import Event

log = logging.getLogger("conveyor.celery_intake")

RESULTS_QUEUE = "conveyor.celery-results"


class OutcomeLoop:
    """Consume results and rejection records until `stop` is set, then drain and return."""

    def __init__(self, broker: Consumer, rejects: tuple[str, ...],
                 backend: RedisResults | None, stop: threading.Event,
                 follower: Follower | None = None) -> None:
        """`follower`: what goes on after a task of a chain or a chord (canvas.py)."""
        self.broker = broker
        self.rejects = rejects
        self.backend = backend
        self.outcomes = Outcomes(backend) if backend is not None else None
        self.stop = stop
        self.follower = follower

    @property
    def queues(self) -> list[str]:
        return [RESULTS_QUEUE, *self.rejects] if self.backend else list(self.rejects)

    def run(self) -> None:
        steps: Generator[Delivery | None, float | None, None] = self.broker.consume(
            self.queues, prefetch=32, timeout=1.0)
        delivery = next(steps)
        while True:
            if delivery is not None:
                self._handle(delivery)
            elif self.stop.is_set():
                return  # stopping, and nothing more was ready
            delivery = steps.send(0.0 if self.stop.is_set() else None)

    def _handle(self, delivery: Delivery) -> None:
        try:
            if delivery.queue == RESULTS_QUEUE:
                self._result(delivery)
            else:
                self._reject(delivery)
        except LeaseLost as exc:
            log.warning("Celery intake: %s", exc)

    def _result(self, delivery: Delivery) -> None:
        try:
            event = Event.decode(delivery.body)
        except MessageError as exc:
            self.broker.dead_letter(delivery, f"not an outcome event: {exc}")
            return
        if self.outcomes is not None:
            document = self.outcomes.handle(event)
            if self.follower is not None:   # before the ack: a crash follows it again
                self.follower.follow(event, document)
        self.broker.ack(delivery)

    def _reject(self, delivery: Delivery) -> None:
        try:
            fields = json.loads(delivery.body)
            reason, task_id = str(fields["reason"]), str(fields["id"])
        except (ValueError, KeyError, TypeError) as exc:
            self.broker.dead_letter(delivery, f"unreadable rejection record ({exc!r})")
            return
        wants = not (fields.get("headers") or {}).get("ignore_result")
        if self.backend is not None and task_id and wants:
            self.backend.store(rejected(task_id, str(fields.get("state")), reason))
        self.broker.dead_letter(delivery, reason)
