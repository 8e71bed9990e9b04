"""Writing outcomes in Celery's result format, so an unchanged `AsyncResult.get()` returns.

Celery's Redis backend keeps one JSON document per task under `celery-task-meta-<id>`
(`status`, `result`, `traceback`, `children`, `date_done`, `task_id`), written with SETEX
and announced with PUBLISH on a channel of the same name, which a waiting `get()` is
subscribed to. A failure's `result` is the exception as Celery's JSON serializer encodes
it (`exc_type`, `exc_message`, `exc_module`), so `get()` raises an exception of that type.

`Outcomes` turns Conveyor's outcome events into those documents: `succeeded` is SUCCESS
(and `skipped`, a task that raised `Skip`: Celery has no such state, SUCCESS with None);
`dead_lettered` (the task will not run again) is FAILURE carrying the error of the last
`failed` event of the same message, when this process saw it.
"""

from __future__ import annotations

import builtins
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import redis
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_fixed,
)

from conveyor import redis_clients
from conveyor.errors import ConfigError, ConveyorError
from conveyor.events import ENDED_WELL, Event
from conveyor.locations import REDIS, redact, scheme

log = logging.getLogger("conveyor.celery_intake")

T = TypeVar("T")
KEY_PREFIX = "celery-task-meta-"
#: Celery's default `result_expires`: one day.
DEFAULT_EXPIRES = 86400
#: Failed events remembered while waiting for the dead-lettered event that follows.
REMEMBERED_ERRORS = 10_000
#: How long a result write keeps trying while Redis is away, and the pause between tries.
RETRY_SECONDS = 30.0
RETRY_PAUSE = 1.0


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

    def __init__(self, url: str, expires: int = DEFAULT_EXPIRES,
                 retry_seconds: float = RETRY_SECONDS,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """`retry_seconds`, `sleep`: how long `store` keeps trying, and how it pauses."""
        if scheme(url) not in (*REDIS, "unix"):
            raise ConfigError(f"--celery-result-backend {redact(url)!r}: only a Redis result "
                              "backend (redis://host:port/db) is supported")
        self.where = redact(url)
        self.expires = expires
        self.retry_seconds = retry_seconds
        self._client = redis_clients.connect(url, socket_timeout=10, socket_connect_timeout=5)
        self._retrying = Retrying(
            sleep=sleep, wait=wait_fixed(RETRY_PAUSE), stop=stop_after_delay(retry_seconds),
            retry=retry_if_exception_type((redis.ConnectionError, redis.TimeoutError)),
            before_sleep=self._say_retrying, retry_error_callback=self._give_up)

    def store(self, document: Mapping[str, Any]) -> None:
        """SET with EX (SETEX) + PUBLISH in one pipeline, retried for `retry_seconds` while
        Redis is away."""
        key = KEY_PREFIX + str(document["task_id"])
        value = json.dumps(document, default=repr)

        def write() -> None:
            with self._client.pipeline() as pipe:
                pipe.set(key, value, ex=self.expires)  # SETEX: redis-py 8 deprecates setex()
                pipe.publish(key, value)
                pipe.execute()
        self._retrying(write)

    def call(self, work: Callable[[redis.Redis], T]) -> T:
        """`work(client)` on the backend's Redis, retried as `store` is."""
        return self._retrying(lambda: work(self._client))

    def _say_retrying(self, state: RetryCallState) -> None:
        """tenacity's before_sleep: one line per failed attempt."""
        assert state.outcome is not None
        log.warning("Celery result backend %s: %s; retrying", self.where,
                    state.outcome.exception())

    def _give_up(self, state: RetryCallState) -> NoReturn:
        """tenacity's retry_error_callback, after `retry_seconds`."""
        assert state.outcome is not None
        exc = state.outcome.exception()
        raise ConveyorError(f"Celery result backend {self.where} unreachable for "
                            f"{self.retry_seconds:g} s ({exc}): results of tasks from "
                            "Celery producers cannot be written") from exc

    def close(self) -> None:
        self._client.close()


class Outcomes:
    """Turns outcome events of Celery-born messages into result documents."""

    def __init__(self, backend: RedisResults) -> None:
        self.backend = backend
        self._errors: OrderedDict[str, Mapping[str, Any]] = OrderedDict()

    def handle(self, event: Event) -> dict[str, Any] | None:
        """Store the document `event` makes, if it makes one; that document."""
        document = self.document(event)
        if document is not None:
            self.backend.store(document)
        return document

    def document(self, event: Event) -> dict[str, Any] | None:
        task_id = event.headers.get("celery_id") or event.message_id
        if event.kind == "failed" and event.error:
            self._errors[event.message_id] = event.error
            while len(self._errors) > REMEMBERED_ERRORS:
                self._errors.popitem(last=False)
        elif event.kind in ENDED_WELL:   # Celery has no skip: a None result
            self._errors.pop(event.message_id, None)
            return meta(task_id, "SUCCESS", event.result)
        elif event.kind == "dead_lettered":
            error = self._errors.pop(event.message_id, {})
            return failure(task_id, error, event.reason)
        elif event.kind == "expired":   # its `expires` passed while it waited: as Celery says
            return rejected(task_id, "REVOKED", f"expired: {event.reason}")
        elif event.kind == "cancelled":  # revoked (revokes.py) or cancelled: as Celery says
            return rejected(task_id, "REVOKED", f"revoked: {event.reason}")
        return None
