"""Tracing with OpenTelemetry, optional: `pip install 'conveyor[otel]'`, `CONVEYOR_TRACING`.

Off by default, and off means free: nothing in this module imports OpenTelemetry, and the
core asks `current()` (one global read) before doing anything for a trace. `configure()`
with a mode other than "off" imports `conveyor.tracing.otel`, the only module that touches
the OpenTelemetry SDK, and from then on `current()` returns its `Tracer`.

The trace context travels in the message envelope as W3C `traceparent` / `tracestate`
headers. A DAG run's trace and span ids, and its task instances' span ids, are derived from
the run and task-instance ids (`run_ids`, `task_instance_ids`): whichever scheduler applies
an event can emit a child of a run that another scheduler, maybe since restarted, started.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from conveyor.errors import ConfigError
from conveyor.tracing.ids import (
    TRACEPARENT,
    TRACESTATE,
    parse_traceparent,
    run_ids,
    task_instance_ids,
    traceparent,
)

if TYPE_CHECKING:
    from conveyor.tracing.otel import Tracer

#: The modes `CONVEYOR_TRACING` takes besides `module:callable` (a factory of a span
#: exporter or processor, for exporters of your own and for tests).
MODES = ("off", "console", "otlp")

_tracer: Tracer | None = None


def current() -> Tracer | None:
    """The process's tracer, or None while tracing is off (the only check hot paths make)."""
    return _tracer


def mode(text: str) -> str:
    """A `CONVEYOR_TRACING` value: off, console, otlp, or module:callable."""
    value = text.strip()
    if value.lower() in MODES:
        return value.lower()
    module, _, name = value.partition(":")
    if module and name and all(part.isidentifier() for part in (*module.split("."), name)):
        return value
    raise ValueError("must be off, console, otlp, or module:callable (a factory returning "
                     "an OpenTelemetry span exporter or processor)")


def configure(tracing: str, service: str) -> Tracer | None:
    """Turn tracing on in this process for `tracing` (a `mode`), once; "off", or the standard
    OTEL_SDK_DISABLED=true, leaves it off and imports nothing."""
    global _tracer
    try:
        chosen = mode(tracing)
    except ValueError as exc:
        raise ConfigError(f"CONVEYOR_TRACING={tracing!r} is not allowed: {exc}") from None
    if _tracer is not None or chosen == "off" or \
            os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return _tracer
    try:
        from conveyor.tracing import otel
    except ImportError as exc:
        raise ConfigError(f"CONVEYOR_TRACING={tracing!r} needs OpenTelemetry, which is not "
                          f"installed ({exc}): pip install 'conveyor[otel]', or set "
                          "CONVEYOR_TRACING=off") from None
    _tracer = otel.Tracer.start(chosen, service)
    return _tracer


def shutdown() -> None:
    """Export what is buffered and turn tracing off (tests, and a clean exit)."""
    global _tracer
    if _tracer is not None:
        _tracer.shutdown()
        _tracer = None


__all__ = ["MODES", "TRACEPARENT", "TRACESTATE", "configure", "current", "mode",
           "parse_traceparent", "run_ids", "shutdown", "task_instance_ids", "traceparent"]
