"""Celery task protocol 2 (JSON) to a Conveyor `Message`: one pure function, `convert`.

A Celery message is headers (`task`, `id`, `retries`, `eta`, `expires`, `timelimit`,
`root_id`, `parent_id`, `ignore_result`, ...) plus a body `[args, kwargs, embed]`. Only the
JSON serializer is read: the content type is checked before the body is touched, so a
pickled (or yaml, msgpack) body is never deserialized; it is rejected with a reason naming
its serializer. `eta` (and `countdown`, which Celery turns into `eta`) becomes a delay on
Conveyor's broker; `expires` becomes the message's own `expires`, so a worker that comes
to it too late (or at once, when it was already past) dead-letters it unrun with reason
`expired` (REVOKED in Celery's result backend, as Celery's own worker says).
Chains and chords either start a scheduler run (`canvas_runs`: `StartsRun`) or are carried
in headers for the outcome loop to follow (`canvas.py`); what of the canvas the intake
cannot run (link callbacks; nested canvases when followed) is rejected: silently dropping
a callback would lose work.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conveyor.celery_intake.canvas_embed import CanvasRefused, canvas_headers, refuse_links
from conveyor.celery_intake.canvas_plan import starts_a_run
from conveyor.message import Message
from conveyor.tasks import Task
from conveyor.tracing import TRACEPARENT, TRACESTATE

#: Content types Celery's other serializers use, by the name people know them by.
SERIALIZERS = {
    "application/x-python-serialize": "pickle",
    "application/x-yaml": "yaml",
    "application/x-msgpack": "msgpack",
    "application/data": "raw bytes",
}
JSON_TYPE = "application/json"
#: The header of a Conveyor message that names the Celery task id it came from.
ID = "celery_id"


@dataclass(frozen=True)
class CeleryMessage:
    """One message as it came off Celery's queue, body still raw bytes."""

    queue: str
    content_type: str
    content_encoding: str
    headers: Mapping[str, Any]
    body: bytes
    properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return str(self.headers.get("id") or self.properties.get("correlation_id") or "")

    @property
    def task_name(self) -> str:
        return str(self.headers.get("task") or "")


@dataclass(frozen=True)
class Accepted:
    """The Conveyor message to publish, deliverable after `delay` seconds."""

    message: Message
    delay: float = 0.0


@dataclass(frozen=True)
class StartsRun:
    """A canvas (chain, chord member) to start as a scheduler run (canvas_runs.py), after
    `delay` seconds (its eta or countdown)."""

    delay: float = 0.0


@dataclass(frozen=True)
class Rejected:
    """Why the message cannot run; `state` is what Celery's result backend is told."""

    reason: str
    state: str = "FAILURE"


class _Reject(Exception):
    def __init__(self, reason: str, state: str = "FAILURE") -> None:
        super().__init__(reason)
        self.rejected = Rejected(reason, state)


def convert(raw: CeleryMessage, queue: str, lookup: Callable[[str], Task[Any, Any] | None],
            now: float, reply_to: str = "", canvas_runs: bool = False
            ) -> Accepted | Rejected | StartsRun:
    """The Conveyor message for `raw` on Conveyor queue `queue`, or why there is none, or
    (`canvas_runs`) that it starts a canvas run.

    `lookup` finds the registered task (its options fill what Celery did not say); `now`
    is the wall clock, passed in so expiry is testable; `reply_to`, if given, is where the
    worker sends the outcome events a result for Celery's backend is made from (unless the
    producer said `ignore_result`).
    """
    try:
        _check_content(raw)
        args, kwargs, embed = arguments(raw)
        delay = _delay(raw.headers, now)
        if canvas_runs:
            refuse_links(embed)
            if starts_a_run(raw.task_name, raw.task_id, raw.queue, raw.headers, args, kwargs,
                            embed):
                return StartsRun(delay)
        canvas = canvas_headers(embed, raw.headers, follows=bool(reply_to))
    except _Reject as exc:
        return exc.rejected
    except CanvasRefused as exc:
        return Rejected(str(exc))
    return Accepted(_message(raw, queue, lookup, args, kwargs, reply_to, canvas), delay)


def _check_content(raw: CeleryMessage) -> None:
    content_type = (raw.content_type or "").lower()
    if content_type != JSON_TYPE:
        name = SERIALIZERS.get(content_type, "an unknown serializer")
        raise _Reject(f"content type {raw.content_type!r} ({name}) is not accepted: the Celery "
                      f"intake reads JSON only and never deserializes {name}; set "
                      "task_serializer='json' in the producer")
    if raw.headers.get("compression"):
        raise _Reject(f"compressed body ({raw.headers['compression']}) is not accepted: turn "
                      "off task_compression in the producer")
    if not raw.task_name or not raw.task_id:
        raise _Reject("not a Celery task protocol 2 message (no 'task' and 'id' headers): "
                      "set task_protocol=2, Celery's default since 4.0")


def arguments(raw: CeleryMessage) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    try:
        body = json.loads(raw.body.decode(raw.content_encoding or "utf-8"))
    except (UnicodeDecodeError, LookupError, json.JSONDecodeError) as exc:
        raise _Reject(f"body is not valid JSON ({exc})") from None
    if not (isinstance(body, list) and len(body) == 3 and isinstance(body[0], list)
            and isinstance(body[1], dict) and isinstance(body[2], dict | None)):
        raise _Reject("body is not [args, kwargs, embed] (Celery task protocol 2)")
    return body[0], body[1], body[2] or {}


def _delay(headers: Mapping[str, Any], now: float) -> float:
    """Seconds until `eta` (0 if none). An `expires` already past is not refused here: it
    becomes the message's own, and the worker that takes it dead-letters it `expired`, as it
    does any message past its `expires` (one behaviour and one code path for both). So it
    is published at once, eta or not; one that passes before its eta is dead-lettered at
    its eta, when it is certainly past."""
    eta = _timestamp(headers, "eta")
    expires = _timestamp(headers, "expires")
    if expires is not None and expires <= now:
        return 0.0
    return max(now, eta or now) - now


def _timestamp(headers: Mapping[str, Any], name: str) -> float | None:
    value = headers.get(name)
    if value in (None, ""):
        return None
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        raise _Reject(f"header {name}={value!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:  # Celery sends UTC unless enable_utc is off
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _limits(headers: Mapping[str, Any]) -> dict[str, float]:
    """Celery's `timelimit` is [hard, soft], either may be None."""
    given = headers.get("timelimit") or (None, None)
    hard, soft = (list(given) + [None, None])[:2]
    out = {}
    if isinstance(hard, int | float) and hard > 0:
        out["time_limit"] = float(hard)
    if isinstance(soft, int | float) and soft > 0:
        out["soft_time_limit"] = float(soft)
    return out


def _message(raw: CeleryMessage, queue: str, lookup: Callable[[str], Task[Any, Any] | None],
             args: list[Any], kwargs: dict[str, Any], reply_to: str,
             canvas: dict[str, str]) -> Message:
    headers = {ID: raw.task_id, "celery_queue": raw.queue, **canvas}
    for name in ("root_id", "parent_id"):
        if raw.headers.get(name):
            headers[f"celery_{name}"] = str(raw.headers[name])
    for name in (TRACEPARENT, TRACESTATE):   # a traced producer's context (W3C)
        if isinstance(raw.headers.get(name), str):
            headers[name] = raw.headers[name]
    if raw.headers.get("ignore_result") and not canvas:   # a canvas goes on from its outcome
        reply_to = ""
    retries = raw.headers.get("retries")
    expires = _timestamp(raw.headers, "expires")   # read by `_delay` already
    fields: dict[str, Any] = {
        "queue": queue, "id": raw.task_id, "headers": headers, "reply_to": reply_to,
        **_limits(raw.headers), **({"expires": expires} if expires is not None else {}),
        "attempt": retries + 1 if isinstance(retries, int) and retries >= 0 else 1}
    task = lookup(raw.task_name)
    if task is None:  # the worker dead-letters it as an unknown task, and says so
        return Message(task=raw.task_name, args=tuple(args), kwargs=kwargs, **fields)
    return task.message(args, kwargs, **fields)
