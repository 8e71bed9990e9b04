"""How long a failed attempt waits before its retry, and why a silent one timed out.

Pure functions of a task instance and the time, used by the engine's transitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.retry import backoff_delay
from conveyor.state.records import TaskInstance

__all__ = ["retry_delay", "timeout_reason"]


def retry_delay(attempt: int, spec: Mapping[str, Any]) -> float:
    """Seconds before retry number `attempt`: `retry.backoff_delay` with the task's base
    delay, cap and jitter."""
    base = float(spec["retry_delay"])
    if base <= 0:
        return 0.0
    return backoff_delay(attempt, base, spec["retry_max_delay"], spec["retry_jitter"])


def timeout_reason(ti: TaskInstance, now: float, start_grace: float = 0.0) -> tuple[str, str]:
    """(outcome, error) for a task instance whose queued or heartbeat deadline passed."""
    if ti.state == "queued":
        waited = now - (now if ti.queued_at is None else ti.queued_at)
        grace = f" + {start_grace:g} s start grace" if start_grace else ""
        return "queued_timeout", (
            f"queued_timeout: queued for {waited:.0f} s on {ti.executor} "
            f"(queue {ti.queue!r}) without starting (limit {ti.queued_timeout:g} s"
            f"{grace}): are workers consuming that queue, with free slots?")
    last = ti.heartbeat_at if ti.heartbeat_at is not None else ti.started_at
    silent = now - (now if last is None else last)
    where = f"{ti.hostname or '?'} pid {ti.pid or '?'}"
    return "heartbeat_timeout", (
        f"heartbeat_timeout: no heartbeat for {silent:.0f} s from the attempt running on "
        f"{where} (limit {ti.heartbeat_timeout:g} s): the worker died or hung")
