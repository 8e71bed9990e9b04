"""Return values in a DAG: TaskFlow arguments, the upstream context, and the run's record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.context import ContextError, TaskContext, context
from conveyor.scheduler import DAG
from conveyor.scheduler.dag import UPSTREAM_REF
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


def pipeline() -> DAG:
    dag = DAG("pipeline")
    orders = dag.task("p.extract", id="extract_orders", retries=1, retry_delay=0)
    clean = dag.task("p.clean", orders, kwargs={"limit": 5})
    dag.task("p.load", upstream=[clean])
    dag.validate(["queue"])
    return dag


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = from_url(f"sqlite:///{tmp_path}/state.db")
    yield opened
    opened.close()


def test_a_task_argument_is_an_upstream_reference_and_an_edge() -> None:
    dag = pipeline()
    assert ("extract_orders", "clean") in dag.edges()
    spec = dag.tasks["clean"].spec()
    assert spec["args"] == [{UPSTREAM_REF: "extract_orders"}]
    assert spec["upstream"] == ["extract_orders"] and spec["kwargs"] == {"limit": 5}


def test_values_flow_down_and_stay_in_the_run(store: Store) -> None:
    """A failed attempt keeps its failure, the successful one its value; the child gets the
    value as its argument and in its context, and the store (the scheduler's only truth,
    read again after a restart) keeps both attempts."""
    dag, executor = pipeline(), RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("extract_orders"), "failed", T0 + 1,
                        error={"type": "IOError", "message": "disk"}), T0 + 1)
    engine.tick(T0 + 2)
    value = {"rows": 1200, "path": "/data/orders.csv"}
    engine.handle(event(executor.pop("extract_orders"), "succeeded", T0 + 3, result=value),
                  T0 + 3)

    clean = executor.pop("clean").message
    assert clean.args == (value,) and clean.kwargs == {"limit": 5}
    assert json.loads(clean.headers["upstream"]) == {"extract_orders": value}
    assert clean.headers["dag"] == "pipeline"

    ti = store.one("run_ti_by_task", run_id=run_id, task_id="extract_orders")
    assert ti is not None and json.loads(ti["result"]) == value
    attempts = store.rows("ti_attempts", ti_id=ti["ti_id"])
    assert [(a["outcome"], a["result"]) for a in attempts] == [
        ("failed", None), ("succeeded", json.dumps(value))]
    assert "disk" in attempts[0]["error"]


def test_context_reads_the_running_tasks_upstream_values() -> None:
    wire = {"id": "M1", "queue": "q", "attempt": 2,
            "headers": {"run": "R1", "dag": "d", "task_id": "load", "conf": '{"day": "x"}',
                        "upstream": '{"clean": {"rows": 3}}'}}
    context.set(TaskContext.from_wire(wire))
    try:
        assert context.upstream("clean") == {"rows": 3}
        assert (context.run_id, context.dag_id, context.task_id, context.attempt,
                context.queue, dict(context.conf)) == ("R1", "d", "load", 2, "q", {"day": "x"})
        with pytest.raises(ContextError, match="no upstream task 'extract'.*clean"):
            context.upstream("extract")
    finally:
        context.set(None)
    with pytest.raises(ContextError, match="only set inside a running task"):
        context.upstream("clean")
