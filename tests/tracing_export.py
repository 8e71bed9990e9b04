"""The span exporter of the tracing tests (CONVEYOR_TRACING=tests.tracing_export:
exporter): the SDK's InMemorySpanExporter, whose spans are also appended, one JSON line each,
to the file $CONVEYOR_TEST_SPANS, so spans made in real client, worker and scheduler
processes reach the test."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

#: CONVEYOR_TRACING for a process whose spans the test reads (with CONVEYOR_TEST_SPANS)
EXPORTER = "tests.tracing_export:exporter"


class FileExporter(InMemorySpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        lines = "".join(json.dumps(record(span)) + "\n" for span in spans).encode()
        fd = os.open(os.environ["CONVEYOR_TEST_SPANS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, lines)   # one append per batch: lines of processes never interleave
        finally:
            os.close(fd)
        return result


def record(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    return {"name": span.name, "trace": f"{context.trace_id:032x}",
            "span": f"{context.span_id:016x}",
            "parent": f"{parent.span_id:016x}" if parent is not None else "",
            "kind": span.kind.name, "start": span.start_time, "end": span.end_time,
            "status": span.status.status_code.name, "attributes": dict(span.attributes or {}),
            "events": [event.name for event in span.events],
            "service": span.resource.attributes.get("service.name"), "pid": os.getpid()}


def exporter() -> FileExporter:
    return FileExporter()


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The spans written to `path`."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
