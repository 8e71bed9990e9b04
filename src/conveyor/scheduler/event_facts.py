"""What a worker's (or an executor's) event says about its attempt, as the engine records it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from conveyor import tracing
from conveyor.events import Event
from conveyor.state.records import TaskInstance

#: Kinds that end an attempt badly; the scheduler retries it while the budget lasts.
FAILED = frozenset({"failed", "oom_killed", "timed_out", "dead_lettered"})


def worker_keeps(event: Event) -> bool:
    """Whether the worker kept the message (requeued at shutdown, or retrying it itself):
    the same attempt goes back to queued."""
    return event.kind in ("interrupted", "retried") or (
        event.kind in FAILED and event.kind != "dead_lettered" and event.retry_in > 0)


def describe(event: Event) -> str:
    """What went wrong, one summary line first, then the traceback if there is one."""
    parts = [event.kind, event.error.get("type", ""), event.error.get("message", "")]
    summary = ": ".join(p for p in parts if p)
    if event.reason and event.reason not in summary:
        summary += f" ({event.reason})"
    traceback = event.error.get("traceback", "")
    return summary + (f"\n{traceback}" if traceback else "")


def what_is_known(event: Event) -> dict[str, Any]:
    """Where and when the attempt ran, as far as `event` says (None: it does not say)."""
    return {"hostname": event.hostname or None, "pid": event.pid or None,
            "started": event.started_at or None}


def output(event: Event) -> str | None:
    """The attempt's last lines of output as stored with it (JSON), None when it sent none."""
    return json.dumps(list(event.log)) if event.log else None


def task_ref(event: Event) -> tuple[str, int] | None:
    """(task-instance id, attempt) of an event, from its headers or its run id."""
    ti, attempt = event.headers.get("ti", ""), event.headers.get("attempt", "")
    if ti and attempt.isdigit():
        return ti, int(attempt)
    ti, _, attempt = event.run_id.rpartition("/")
    return (ti, int(attempt)) if ti and attempt.isdigit() else None


def by_run(events: Sequence[Event]) -> list[list[Event]]:
    """`events` grouped by the run they name (the worker copies the message's `run` header),
    each group in arrival order, groups in order of their first event. An event naming no
    run is a group of its own."""
    groups: dict[str, list[Event]] = {}
    for i, event in enumerate(events):
        groups.setdefault(event.headers.get("run") or f"#{i}", []).append(event)
    return list(groups.values())


def trace_attempt(ti: TaskInstance, attempt: int, outcome: str, now: float,
                  error: str = "") -> None:
    """The span of an attempt that ended (while tracing is on): from queued to `now`."""
    tracer = tracing.current()
    if tracer is not None:
        name = f"{ti.spec.get('dag_id', '')}.{ti.task_id}".lstrip(".")
        tracer.task_instance(ti.run_id, ti.ti_id, attempt, name, start=ti.queued_at,
                             end=now, outcome=outcome, error=error)
