"""Spans made in process. A DAG run's trace when its events are applied by two schedulers,
one after the other (a restart, or a second scheduler): the run's span and its task
instances' spans share the ids the run id gives, whichever scheduler makes them. A task that
enqueues a follow-up: the follow-up's trace goes on from the task's run span. Engines on
SQLite in tmp_path; spans through the tracing tests' exporter (the SDK's in-memory one,
written to a file)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import tracing
from conveyor.context import TaskContext, context
from conveyor.message import Message
from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, event
from tests.tracing_export import EXPORTER, read

T0 = 1_700_000_000.0


@pytest.fixture
def spans_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "spans.jsonl"
    monkeypatch.setenv("CONVEYOR_TEST_SPANS", str(path))
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    assert tracing.configure(EXPORTER, "conveyor-scheduler") is not None
    yield path
    tracing.shutdown()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = from_url(f"sqlite:///{tmp_path}/state.db")
    yield opened
    opened.close()


def two_steps() -> DAG:
    dag = DAG("traced")
    dag.command("a", ["true"]) >> dag.command("b", ["true"], retries=1, retry_delay=0)
    dag.validate(["queue"])
    return dag


def finish(engine: Engine, executor: RecordingExecutor, task_id: str, kind: str,
           at: float) -> dict[str, Any]:
    work = executor.pop(task_id)
    engine.handle(event(work, "started", at), at)
    engine.handle(event(work, kind, at + 1, error={"type": "E", "message": "no"}), at + 1)
    return dict(work.message.headers)


def test_spans_made_by_two_schedulers_form_one_trace(store: Store, spans_file: Path) -> None:
    dag, executor = two_steps(), RecordingExecutor()
    first = Engine(store, {"queue": executor}, dags={"traced": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    first.tick(T0)
    sent = [finish(first, executor, "a", "succeeded", T0 + 1)]
    second = Engine(store, {"queue": executor}, dags={"traced": dag})   # the other scheduler
    sent.append(finish(second, executor, "b", "failed", T0 + 3))
    second.tick(T0 + 5)                                                  # the retry
    sent.append(finish(second, executor, "b", "succeeded", T0 + 6))

    spans = read(spans_file)
    trace_id, span_id = tracing.run_ids(run_id)
    (root,) = [s for s in spans if s["name"] == "dag_run traced"]
    assert (root["trace"], root["span"], root["parent"]) == (f"{trace_id:032x}",
                                                             f"{span_id:016x}", "")
    assert root["start"] == T0 * 1e9 and root["end"] == (T0 + 7) * 1e9
    attempts = [s for s in spans if s["name"].startswith("task traced.")]
    assert [(s["name"], s["attributes"]["conveyor.attempt"], s["status"]) for s in attempts] \
        == [("task traced.a", 1, "UNSET"), ("task traced.b", 1, "ERROR"),
            ("task traced.b", 2, "UNSET")]
    assert {(s["trace"], s["parent"]) for s in attempts} == {(root["trace"], root["span"])}
    # each attempt's message named that attempt's span as its parent, before it existed
    assert [tracing.parse_traceparent(h["traceparent"]) for h in sent] == [
        (int(s["trace"], 16), int(s["span"], 16), True) for s in attempts]


def test_a_task_enqueuing_a_follow_up_makes_it_a_child_of_its_run_span(
        spans_file: Path) -> None:
    tracer = tracing.current()
    assert tracer is not None
    run_span = tracing.traceparent(0xABC, 0xDEF)
    context.set(TaskContext(message_id="m", traceparent=run_span))
    try:
        sent = tracer.produced(Message(queue="q", task="t.next"))
    finally:
        context.set(None)
    (enqueue,) = read(spans_file)
    assert (enqueue["trace"], enqueue["parent"]) == (f"{0xABC:032x}", f"{0xDEF:016x}")
    assert sent.headers["traceparent"] == tracing.traceparent(0xABC, int(enqueue["span"], 16))
