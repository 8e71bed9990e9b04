"""The outcome loop: results back to Celery's backend, rejected messages to dead letters.

One consumer on Conveyor's own broker reads two kinds of queues:

* `conveyor.celery-results`: the outcome events the worker publishes for Celery-born
  messages (their `reply_to`, set only when a result backend is configured). Succeeded and
  dead-lettered events become Celery result documents (`results.py`); the next step of a
  chain or a chord's callback is published (`canvas.py`); the event is acked after both,
  so a crash does them again rather than never.
* `conveyor.celery-canvas` (names.CANVAS_QUEUE): messages that start a Celery canvas as a
  scheduler run (`canvas_runs.py`); acked once the run exists and is watched, dead-lettered
  with the reason (and the producer's results told) if the canvas cannot run.
* `celery.<queue>.rejected`: rejection records from the feed. Each is dead-lettered with the
  reason it carries (so `conveyor queues` lists it under that queue's dead letters, body
  kept), and its producer's `get()` is told FAILURE or REVOKED instead of waiting forever.
  The reason travels inside the record because the seam can only dead-letter a delivery.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Generator

from conveyor.broker import Consumer, Delivery
from conveyor.celery_intake.canvas import Follower
from conveyor.celery_intake.canvas_embed import CanvasRefused
from conveyor.celery_intake.canvas_runs import CanvasRuns, raw_of, task_ids
from conveyor.celery_intake.names import CANVAS_QUEUE
from conveyor.celery_intake.results import Outcomes, RedisResults, rejected
from conveyor.errors import LeaseLost, MessageError
from conveyor.events import Event

log = logging.getLogger("conveyor.celery_intake")

RESULTS_QUEUE = "conveyor.celery-results"


class OutcomeLoop:
    """Consume results and rejection records until `stop` is set, then drain and return."""

    def __init__(self, broker: Consumer, rejects: tuple[str, ...],
                 backend: RedisResults | None, stop: threading.Event,
                 follower: Follower | None = None, canvas: CanvasRuns | None = None) -> None:
        """`follower`: what goes on after a task of a chain or a chord (canvas.py);
        `canvas`: what starts a canvas run (canvas_runs.py)."""
        self.broker = broker
        self.rejects = rejects
        self.backend = backend
        self.outcomes = Outcomes(backend) if backend is not None else None
        self.stop = stop
        self.follower = follower
        self.canvas = canvas

    @property
    def queues(self) -> list[str]:
        canvas = [CANVAS_QUEUE] if self.canvas is not None else []
        return [RESULTS_QUEUE, *canvas, *self.rejects] if self.backend else list(self.rejects)

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
            elif delivery.queue == CANVAS_QUEUE:
                self._canvas(delivery)
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

    def _canvas(self, delivery: Delivery) -> None:
        """Start the run of a canvas (or keep a chord's member until the rest come)."""
        assert self.canvas is not None
        try:
            raw = raw_of(json.loads(delivery.body))
        except (ValueError, KeyError, TypeError) as exc:
            self.broker.dead_letter(delivery, f"unreadable canvas record ({exc!r})")
            return
        try:
            self.canvas.start(raw)
        except CanvasRefused as exc:
            reason = f"a Celery canvas the intake cannot run: {exc}"
            log.warning("Celery message %s (%s) is refused: %s", raw.task_id, raw.task_name,
                        reason)
            for task_id in dict.fromkeys([raw.task_id, *_canvas_ids(raw.body)]):
                self.canvas.backend.store(rejected(task_id, "FAILURE", reason))
            self.broker.dead_letter(delivery, reason)
            return
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
            # every AsyncResult the producer may hold of a canvas: its steps' too
            body = base64.b64decode(str(fields.get("body_base64", "")))
            for each in dict.fromkeys([task_id, *_canvas_ids(body)]):
                self.backend.store(rejected(each, str(fields.get("state")), reason))
        self.broker.dead_letter(delivery, reason)


def _canvas_ids(body: bytes) -> list[str]:
    """The Celery task ids a message's body names in its embed (a canvas's other steps)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return []
    return task_ids(parsed[2]) if isinstance(parsed, list) and len(parsed) == 3 else []
