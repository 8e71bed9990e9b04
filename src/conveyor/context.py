"""The running task's context: who it is, in which run, and what its upstream tasks returned.

    from conveyor import context, task

    @task
    def clean_orders() -> int:
        orders = context.upstream("extract_orders")     # that task's return value
        ...

The runner sets it before calling the task (from the message: its id, queue and attempt,
and for a DAG task the headers the scheduler adds: run, DAG, task id, conf and the upstream
values). Outside a task, reading it raises a `ContextError` that says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import ConveyorError


class ContextError(ConveyorError):
    """The context was read outside a task, or names an upstream task that has no value."""


@dataclass(frozen=True)
class TaskContext:
    message_id: str = ""
    queue: str = ""
    attempt: int = 0
    run_id: str = ""
    dag_id: str = ""
    task_id: str = ""
    logical_date: str = ""   # ISO-8601 UTC, the run's (a DAG task only)
    traceparent: str = ""    # W3C trace context of the task's run span (tracing on only)
    map_index: int = -1      # an instance of a mapped task (`expand`): its element; else -1
    conf: Mapping[str, Any] = field(default_factory=dict)
    upstream_values: Mapping[str, Any] = field(default_factory=dict)
    #: the asset (and named) events that started the run: uri, extra, source, created_at...
    triggering_asset_events: tuple[Mapping[str, Any], ...] = ()
    #: what the trigger it deferred on fired with (`conveyor.Defer`); None in a task's first
    #: segment (not resumed from a deferral)
    trigger_event: Any = None

    def upstream(self, task_id: str) -> Any:
        """What upstream task `task_id` of this run returned."""
        if task_id not in self.upstream_values:
            known = ", ".join(sorted(self.upstream_values)) or "none"
            raise ContextError(f"task {self.task_id or self.message_id} has no upstream task "
                               f"{task_id!r} with a value (its upstream tasks: {known})")
        return self.upstream_values[task_id]

    def as_environment(self) -> dict[str, str]:
        """The context of a command task, as variables (Airflow's AIRFLOW_CTX_* are the model;
        a prefix of their own, so none is mistaken for a CONVEYOR_* setting)."""
        values = {"RUN_ID": self.run_id, "DAG_ID": self.dag_id, "TASK_ID": self.task_id,
                  "LOGICAL_DATE": self.logical_date, "ATTEMPT": str(self.attempt),
                  "QUEUE": self.queue, "MESSAGE_ID": self.message_id,
                  "MAP_INDEX": str(self.map_index),
                  "CONF": json.dumps(dict(self.conf))}
        found = {f"CONVEYOR_CTX_{name}": value for name, value in values.items()}
        if self.traceparent:   # OpenTelemetry's name for a trace context in the environment
            found["TRACEPARENT"] = self.traceparent
        return found

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> TaskContext:
        """The context of a message as the supervisor hands it to a runner."""
        headers = message.get("headers") or {}
        return cls(message_id=message.get("id", ""), queue=message.get("queue", ""),
                   attempt=int(message.get("attempt", 0)), run_id=headers.get("run", ""),
                   dag_id=headers.get("dag", ""), task_id=headers.get("task_id", ""),
                   logical_date=headers.get("logical_date", ""),
                   traceparent=headers.get("traceparent", ""),
                   map_index=int(headers.get("map_index", -1)),
                   conf=_object(headers.get("conf")),
                   upstream_values=_object(headers.get("upstream")),
                   triggering_asset_events=_events(headers.get("asset_events")),
                   trigger_event=_payload(headers.get("trigger_event")))


def _object(text: str | None) -> dict[str, Any]:
    """A JSON object header; absent or "{}" (most tasks) without the JSON decoder, whose
    first use in a fresh runner costs it ~0.1 ms of copy-on-write faults."""
    if not text or text == "{}":
        return {}
    value: dict[str, Any] = json.loads(text)
    return value


def _payload(text: str | None) -> Any:
    """The `trigger_event` header (JSON), absent unless the task resumed from a deferral."""
    return json.loads(text) if text else None


def _events(text: str | None) -> tuple[Mapping[str, Any], ...]:
    """The `asset_events` header (a JSON list), absent in runs not started by assets."""
    return tuple(json.loads(text)) if text else ()


class CurrentContext:
    """`conveyor.context`: the running task's `TaskContext`, read where it is used."""

    def __init__(self) -> None:
        self._current: TaskContext | None = None
        self._asset_extra: dict[str, dict[str, Any]] = {}

    def set(self, value: TaskContext | None) -> None:
        self._current = value
        self._asset_extra = {}

    def set_asset_extra(self, outlet: Any, extra: Mapping[str, Any]) -> None:
        """Give the asset event that outlet `outlet` (an `Asset`, or its URI) records when
        this task succeeds these `extra` keys (over what the task returns, if an object);
        Airflow's `outlet_events[asset].extra`. JSON values only."""
        self.get()
        self._asset_extra.setdefault(str(getattr(outlet, "uri", outlet)), {}).update(extra)

    def asset_extras(self) -> dict[str, dict[str, Any]]:
        """What `set_asset_extra` was given in this task, by URI (the runner reports it)."""
        return self._asset_extra

    def get(self) -> TaskContext:
        if self._current is None:
            raise ContextError("conveyor.context is only set inside a running task")
        return self._current

    def upstream(self, task_id: str) -> Any:
        """What upstream task `task_id` of this DAG run returned."""
        return self.get().upstream(task_id)

    @property
    def run_id(self) -> str:
        return self.get().run_id

    @property
    def dag_id(self) -> str:
        return self.get().dag_id

    @property
    def task_id(self) -> str:
        return self.get().task_id

    @property
    def attempt(self) -> int:
        return self.get().attempt

    @property
    def conf(self) -> Mapping[str, Any]:
        return self.get().conf

    @property
    def queue(self) -> str:
        return self.get().queue

    @property
    def message_id(self) -> str:
        return self.get().message_id

    @property
    def logical_date(self) -> str:
        return self.get().logical_date

    @property
    def map_index(self) -> int:
        """Which element this instance of a mapped task runs (-1: not mapped, as Airflow)."""
        return self.get().map_index

    @property
    def trigger_event(self) -> Any:
        """What the trigger this task deferred on fired with (`conveyor.Defer`); None in
        its first segment: a task that defers tells the two apart by it."""
        return self.get().trigger_event

    @property
    def triggering_asset_events(self) -> tuple[Mapping[str, Any], ...]:
        """The asset events (and named events) that started this run, oldest first: each
        has uri, extra, source, created_at and, from a task, its dag_id, run_id, task_id."""
        return self.get().triggering_asset_events

    @property
    def traceparent(self) -> str:
        """The task's `run` span as a W3C traceparent ("" while tracing is off), to start
        spans of your own under it."""
        return self.get().traceparent


context = CurrentContext()

#: Set in a command task's environment (with the rest of its context): the process, or one
#: it started, runs inside a task.
COMMAND_MARKER = "CONVEYOR_CTX_MESSAGE_ID"


def inside_task() -> bool:
    """Whether this process runs a task: a Python task's runner (its context is set) or a
    command task (or a process it started, which inherits its environment)."""
    return context._current is not None or COMMAND_MARKER in os.environ
