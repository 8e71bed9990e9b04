"""Writing outcomes in Celery's result format, so an unchanged `AsyncResult.get()` returns.

Celery's Redis backend keeps one JSON document per task under `celery-task-meta-<id>`
(`status`, `result`, `traceback`, `children`, `date_done`, `task_id`), written with SETEX
and announced with PUBLISH on a channel of the same name, which a waiting `get()` is
subscribed to. A failure's `result` is the exception as Celery's JSON serializer encodes
it (`exc_type`, `exc_message`, `exc_module`), so `get()` raises an exception of that type.

`Outcomes` turns Conveyor's outcome events into those documents: `succeeded` is SUCCESS;
`dead_lettered` (the task will not run again) is FAILURE carrying the error of the last
`failed` event of the same message, when this process saw it.
"""

from __future__ import annotations

import builtins
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import redis

from conveyor.errors import ConfigError, ConveyorError
from conveyor.events import Event
from conveyor.locations import redact

log = logging.getLogger("conveyor.celery_intake")

KEY_PREFIX = "celery-task-meta-"
#: Celery's default `result_expires`: one day.
DEFAULT_EXPIRES = 86400
#: Failed events remembered while waiting for the dead-lettered event that follows.
REMEMBERED_ERRORS = 10_000
RETRY_SECONDS = 30.0


def meta(task_id: str, status: str, result: Any, traceback: str | None = None) -> dict[str, Any]:
    """One result document, as Celery's backend writes it."""
    return {"status": status, "result": result, "traceback": traceback, "children": [],
            "date_done": datetime.now(UTC).isoformat(), "task_id": task_id}


def exception(error_type: str, message: str | list[Any], module: str | None = None
              ) -> dict[str, Any]:
    """An exception as Celery's JSON serializer writes it: its qualified type, its module
    and its `args` (a bare message becomes the one argument); builtins keep their type."""
    if module is None and isinstance(getattr(builtins, error_type, None), type) \
            and issubclass(getattr(builtins, error_type), BaseException):
        module = "builtins"
    args = message if isinstance(message, list) else [message]
    return {"exc_type": error_type, "exc_message": args, "exc_module": module}


def failure(task_id: str, error: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """FAILURE from a Conveyor error ({type, module, args, message, traceback}) or, lacking
    one, a reason. A runner's report has the exception's `args`, so `get()` raises
    `KeyError('k9')` and not `KeyError("'k9'")`; an older report only has the message."""
    if error.get("type"):
        args = error.get("args")
        exc = exception(error["type"], args if isinstance(args, list) else
                        str(error.get("message", "")), error.get("module") or None)
        return meta(task_id, "FAILURE", exc, error.get("traceback") or None)
    return meta(task_id, "FAILURE", exception("TaskFailed", reason, "conveyor"), None)


def rejected(task_id: str, state: str, reason: str) -> dict[str, Any]:
    """A message the intake refused: REVOKED (expired) or FAILURE, as Celery would say."""
    if state == "REVOKED":
        return meta(task_id, "REVOKED", exception("TaskRevokedError", reason,
                                                  "celery.exceptions"))
    return meta(task_id, "FAILURE", exception("ContentDisallowed", reason, "kombu.exceptions"))


class RedisResults:
    """Celery's Redis result backend, write side only."""

    def __init__(self, url: str, expires: int = DEFAULT_EXPIRES) -> None:
        if not url.lower().startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"--celery-result-backend {redact(url)!r}: only a Redis result "
                              "backend (redis://host:port/db) is supported")
        self.where = redact(url)
        self.expires = expires
        self._client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)

    def store(self, document: Mapping[str, Any]) -> None:
        """SETEX + PUBLISH in one pipeline, retried for a while if Redis is away."""
        key = KEY_PREFIX + str(document["task_id"])
        value = json.dumps(document, default=repr)
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            try:
                with self._client.pipeline() as pipe:
                    pipe.setex(key, self.expires, value)
                    pipe.publish(key, value)
                    pipe.execute()
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise ConveyorError(f"Celery result backend {self.where} unreachable for "
                                        f"{RETRY_SECONDS:g} s ({exc}): results of tasks from "
                                        "Celery producers cannot be written") from exc
                log.warning("Celery result backend %s: %s; retrying", self.where, exc)
                time.sleep(1.0)

    def close(self) -> None:
        self._client.close()


class Outcomes:
    """Turns outcome events of Celery-born messages into result documents."""

    def __init__(self, backend: RedisResults) -> None:
        self.backend = backend
        self._errors: OrderedDict[str, Mapping[str, Any]] = OrderedDict()

    def handle(self, event: Event) -> None:
        task_id = event.headers.get("celery_id") or event.message_id
        if event.kind == "failed" and event.error:
            self._errors[event.message_id] = event.error
            while len(self._errors) > REMEMBERED_ERRORS:
                self._errors.popitem(last=False)
        elif event.kind == "succeeded":
            self._errors.pop(event.message_id, None)
            self.backend.store(meta(task_id, "SUCCESS", event.result))
        elif event.kind == "dead_lettered":
            error = self._errors.pop(event.message_id, {})
            self.backend.store(failure(task_id, error, event.reason))
