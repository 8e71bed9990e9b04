"""W3C trace context, and the span ids a DAG run's spans derive from its ids.

Pure functions, no OpenTelemetry: the scheduler puts a task instance's `traceparent` in its
message whether or not this process could emit the span.
"""

from __future__ import annotations

import hashlib

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """The W3C `traceparent` header of a span."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def parse_traceparent(value: str) -> tuple[int, int, bool] | None:
    """(trace id, span id, sampled) of a W3C `traceparent`, or None if it is not one."""
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 \
            or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(flags & 1)


def _derived(key: str) -> tuple[int, int]:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def run_ids(run_id: str) -> tuple[int, int]:
    """(trace id, span id) of a DAG run's span: the same in every scheduler, at any time."""
    return _derived(f"conveyor-run:{run_id}")


def task_instance_ids(run_id: str, ti_id: str, attempt: int) -> tuple[int, int]:
    """(trace id, span id) of one attempt of a task instance: a child of its run's span."""
    return run_ids(run_id)[0], _derived(f"conveyor-ti:{ti_id}/{attempt}")[1]


