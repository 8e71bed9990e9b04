"""The OpenTelemetry side of `conveyor.tracing`: the only module that imports it.

Spans, one trace per message (and per DAG run):

    enqueue <task>      client, PRODUCER: encoding and publishing; its context goes in the
                        message's `traceparent` header (a child of the caller's current span,
                        else of a `traceparent` already in the headers: a DAG task instance's,
                        a Celery producer's)
      claim <task>      worker, CONSUMER: from the delivery to its settlement, one per delivery
        run <task>      the runner's time, start and end as the runner measured them (it
                        reports them; the supervisor emits the span, so a runner that exits
                        right after its report loses nothing and never loads the SDK)
        outcome <task>  worker: outcome events published, result kept, message settled
    dag_run <dag>       scheduler, emitted when the run ends
      task <dag>.<task> scheduler, one per attempt, from queued to its outcome; the parent
                        of that attempt's `enqueue`

Spans whose ids are fixed in advance (a runner's, a DAG run's, a task instance's) are made
through an id generator that hands out a preset id once: the public SDK way to choose ids.
"""

from __future__ import annotations

import atexit
import importlib
import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from conveyor.context import ContextError, context
from conveyor.errors import ConfigError
from conveyor.events import ENDED_WELL
from conveyor.message import Message
from conveyor.tracing.ids import TRACEPARENT, TRACESTATE, run_ids, task_instance_ids

_W3C = TraceContextTextMapPropagator()
_SYSTEM = {"messaging.system": "conveyor"}
#: Seconds a process's exit waits for its last spans to be exported. The OTLP exporter
#: retries an unreachable collector until OTEL_EXPORTER_OTLP_TIMEOUT (10 s); past this it is
#: interrupted, so a producer script or a stopping worker never hangs on a missing collector.
EXIT_FLUSH = 2.0


class PresetIds(RandomIdGenerator):
    """Random ids, except the next one asked for after `preset` (in this thread)."""

    def __init__(self) -> None:
        self._next = threading.local()

    def preset(self, trace_id: int | None, span_id: int) -> None:
        self._next.trace_id, self._next.span_id = trace_id, span_id

    def generate_span_id(self) -> int:
        span_id = getattr(self._next, "span_id", None)
        self._next.span_id = None
        return span_id or super().generate_span_id()

    def generate_trace_id(self) -> int:
        trace_id = getattr(self._next, "trace_id", None)
        self._next.trace_id = None
        return trace_id or super().generate_trace_id()


class Interruptible(SpanExporter):
    """An exporter whose `shutdown` may come twice: once to interrupt its retries when the
    exit budget is spent, once more from the processor shutting down."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._down = threading.Lock()
        self.down = False

    def export(self, spans: Any) -> Any:
        return self.inner.export(spans)

    def shutdown(self) -> None:
        with self._down:
            if self.down:
                return
            self.down = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def processor(mode: str) -> tuple[SpanProcessor, Interruptible | None]:
    """console: spans printed as they end; otlp: batched to the OTLP/HTTP endpoint the
    standard OTEL_EXPORTER_OTLP_* variables name (a missing collector costs failed exports,
    logged, never the work; that one is also returned, to be interrupted at exit);
    module:callable: what that factory returns."""
    if mode == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter()), None
    if mode == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = Interruptible(OTLPSpanExporter())
        return BatchSpanProcessor(exporter), exporter
    module, _, name = mode.partition(":")
    try:
        made = getattr(importlib.import_module(module), name)()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"CONVEYOR_TRACING={mode!r}: cannot load {name} from {module} "
                          f"({exc})") from None
    if isinstance(made, SpanExporter):
        return SimpleSpanProcessor(made), None
    if isinstance(made, SpanProcessor):
        return made, None
    raise ConfigError(f"CONVEYOR_TRACING={mode!r} returned a {type(made).__name__}, not an "
                      "OpenTelemetry SpanExporter or SpanProcessor")


def _remote(trace_id: int, span_id: int) -> otel_context.Context:
    """A context whose current span is the (remote) span with these ids."""
    span = SpanContext(trace_id, span_id, is_remote=True,
                       trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(span))


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


class Tracer:
    """Makes conveyor's spans; see the module docstring for which, where."""

    def __init__(self, provider: TracerProvider, ids: PresetIds,
                 exporter: Interruptible | None = None) -> None:
        self.provider = provider
        self.ids = ids
        self.exporter = exporter
        self.tracer = provider.get_tracer("conveyor")

    @classmethod
    def start(cls, mode: str, service: str) -> Tracer:
        """A provider of our own (it must hand out preset ids), also made the global one
        unless the application set one already, so spans of task and application code join
        the same traces."""
        ids = PresetIds()
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
        provider = TracerProvider(resource=Resource.create(attributes), id_generator=ids,
                                  shutdown_on_exit=False)
        made, exporter = processor(mode)
        provider.add_span_processor(made)
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)
        tracer = cls(provider, ids, exporter)
        atexit.register(tracer.shutdown)
        return tracer

    def shutdown(self, budget: float = EXIT_FLUSH) -> None:
        """Export what is left, waiting at most `budget` seconds before interrupting the
        exporter (its last spans are then lost, and it logs that)."""
        atexit.unregister(self.shutdown)
        closing = threading.Thread(target=self.provider.shutdown, daemon=True,
                                   name="conveyor-tracing-shutdown")
        closing.start()
        closing.join(budget)
        if closing.is_alive() and self.exporter is not None:
            self.exporter.shutdown()
            closing.join(budget)

    def _span(self, name: str, parent: otel_context.Context | None, *, ids: tuple[int | None,
              int] | None = None, **kwargs: Any) -> trace.Span:
        if ids is not None:
            self.ids.preset(*ids)
        try:
            return self.tracer.start_span(name, context=parent, **kwargs)
        finally:
            if ids is not None:
                self.ids.preset(None, 0)

    # -- producing --------------------------------------------------------------------------

    def _parent_of(self, message: Message) -> otel_context.Context | None:
        """The caller's current span if there is one, else the context in the headers, else
        the run span of the task this code runs in (a task enqueuing a follow-up)."""
        if trace.get_current_span().get_span_context().is_valid:
            return None
        carrier = message.headers if TRACEPARENT in message.headers else _running_task()
        return _W3C.extract(dict(carrier)) if carrier else None

    @contextmanager
    def producing(self, message: Message) -> Iterator[Message]:
        """The `enqueue` span around a publish; yields the message carrying its context."""
        span = self._span(f"enqueue {message.label}", self._parent_of(message),
                          kind=SpanKind.PRODUCER, attributes=_message_attributes(message))
        try:
            yield _carrying(message, span)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise
        finally:
            span.end()

    def produced(self, message: Message) -> Message:
        """The message carrying a new `enqueue` span's context (published later, in a batch)."""
        with self.producing(message) as carrying:
            return carrying

    # -- consuming --------------------------------------------------------------------------

    def claimed(self, message: Message, queue: str, hostname: str) -> Claim:
        """A delivery accepted by a worker: the `claim` span starts."""
        parent = _W3C.extract(dict(message.headers)) if TRACEPARENT in message.headers else None
        span = self._span(f"claim {message.label}", parent, kind=SpanKind.CONSUMER,
                          attributes={**_message_attributes(message, queue),
                                      "messaging.operation.type": "process",
                                      "conveyor.delivery": message.deliveries,
                                      "host.name": hostname})
        return Claim(self, span, message.label)

    def rejected(self, message: Message, queue: str, hostname: str, reason: str) -> None:
        """A delivery dead-lettered at once (over its delivery cap, an unknown task)."""
        claim = self.claimed(message, queue, hostname)
        claim.span.set_status(Status(StatusCode.ERROR, reason))
        claim.settled("dead_letter", reason)

    # -- DAG runs ---------------------------------------------------------------------------

    def task_instance(self, run_id: str, ti_id: str, attempt: int, name: str, *,
                      start: float | None, end: float, outcome: str, error: str = "") -> None:
        """One attempt of a task instance ended: its span, a child of the run's."""
        trace_id, span_id = task_instance_ids(run_id, ti_id, attempt)
        span = self._span(f"task {name}", _remote(*run_ids(run_id)), ids=(None, span_id),
                          start_time=_ns(start if start is not None else end),
                          attributes={"conveyor.run_id": run_id, "conveyor.ti_id": ti_id,
                                      "conveyor.attempt": attempt, "conveyor.outcome": outcome})
        if outcome != "success":
            span.set_status(Status(StatusCode.ERROR, error.split("\n", 1)[0][:500]))
        span.end(end_time=_ns(end))

    def dag_run(self, run_id: str, dag_id: str, *, start: float | None, end: float,
                state: str) -> None:
        """A DAG run ended: its span, the root of its trace, with the ids its id gives."""
        span = self._span(f"dag_run {dag_id}", None, ids=run_ids(run_id),
                          start_time=_ns(start if start is not None else end),
                          attributes={"conveyor.run_id": run_id, "conveyor.dag_id": dag_id,
                                      "conveyor.state": state})
        if state != "success":
            span.set_status(Status(StatusCode.ERROR, f"run {state}"))
        span.end(end_time=_ns(end))


class Claim:
    """The spans of one delivery in a worker: claim, then run and outcome inside it."""

    def __init__(self, tracer: Tracer, span: trace.Span, label: str) -> None:
        self.tracer = tracer
        self.span = span
        self.label = label
        self.context = trace.set_span_in_context(span)
        self.run_span_id = 0
        self.handed_at = 0
        self.outcome: trace.Span | None = None

    def starting(self) -> str:
        """The task goes to a runner: the `traceparent` of its `run` span, for its context."""
        self.run_span_id = secrets.randbits(64) or 1
        self.handed_at = time.time_ns()
        trace_id = self.span.get_span_context().trace_id
        return f"00-{trace_id:032x}-{self.run_span_id:016x}-01"

    def ran(self, report: Mapping[str, Any] | None, outcome: str, reason: str,
            error: Mapping[str, Any], pid: int) -> None:
        """The runner is done: its `run` span (times from its report, else from here), and
        the `outcome` span begins."""
        if self.run_span_id:
            start, end = (report or {}).get("span") or (self.handed_at, time.time_ns())
            run = self.tracer._span(f"run {self.label}", self.context,
                                    ids=(None, self.run_span_id), start_time=int(start),
                                    attributes={"process.pid": pid})
            _set_outcome(run, outcome, reason, error)
            run.end(end_time=int(end))
        self.outcome = self.tracer._span(f"outcome {self.label}", self.context,
                                         attributes={"conveyor.outcome": outcome})
        _set_outcome(self.span, outcome, reason, {})

    def settled(self, verb: str, reason: str) -> None:
        """The message is settled (ack, retry, requeue, dead-letter): both spans end."""
        for span in (self.outcome, self.span):
            if span is not None:
                span.set_attribute("conveyor.action", verb)
                if reason:
                    span.set_attribute("conveyor.action_reason", reason[:500])
                span.end()


def _set_outcome(span: trace.Span, outcome: str, reason: str,
                 error: Mapping[str, Any]) -> None:
    span.set_attribute("conveyor.outcome", outcome)
    if outcome in ENDED_WELL:
        return
    span.set_status(Status(StatusCode.ERROR, (reason or error.get("message", ""))[:500]))
    if error:
        span.add_event("exception", {"exception.type": str(error.get("type", "")),
                                     "exception.message": str(error.get("message", "")),
                                     "exception.stacktrace": str(error.get("traceback", ""))})


def _running_task() -> dict[str, str]:
    """The trace context of the task running in this process ({} outside a task)."""
    try:
        parent = context.traceparent
    except ContextError:
        return {}
    return {TRACEPARENT: parent} if parent else {}


def _message_attributes(message: Message, queue: str = "") -> dict[str, Any]:
    found = {**_SYSTEM, "messaging.destination.name": queue or message.queue,
             "messaging.message.id": message.id, "conveyor.task": message.label,
             "conveyor.attempt": message.attempt}
    if message.run_id:
        found["conveyor.run_id"] = message.run_id
    return found


def _carrying(message: Message, span: trace.Span) -> Message:
    """`message` with `span`'s context in its headers (replacing any it carried)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    headers = {k: v for k, v in message.headers.items() if k not in (TRACEPARENT, TRACESTATE)}
    return replace(message, headers={**headers, **carrier})
