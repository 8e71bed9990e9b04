"""What a DAG task learns about itself: the headers the scheduler sends become its context."""

from __future__ import annotations

import pytest

from conveyor.context import ContextError, CurrentContext, TaskContext
from conveyor.scheduler import DAG, Asset
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from tests.support import RecordingExecutor

T0 = 1_700_000_000.0   # 2023-11-14T22:13:20Z
LOGICAL = 1_699_920_000.0   # 2023-11-14T00:00:00Z


def test_a_dag_task_knows_its_run_date_conf_and_attempt(store: Store) -> None:
    dag = DAG("d")
    dag.command("a", ["true"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"d": dag})
    run_id = create_run(store, dag, T0, executors=["queue"], logical_date=LOGICAL,
                        conf={"day": "2023-11-14"})
    engine.tick(T0)
    message = executor.pop("a").message
    wire = {"id": message.id, "queue": message.queue, "attempt": message.attempt,
            "headers": dict(message.headers)}
    context = TaskContext.from_wire(wire)
    assert (context.run_id, context.dag_id, context.task_id) == (run_id, "d", "a")
    assert context.logical_date == "2023-11-14T00:00:00.000+00:00"
    assert dict(context.conf) == {"day": "2023-11-14"} and context.attempt == 1
    assert context.as_environment()["CONVEYOR_CTX_LOGICAL_DATE"] == context.logical_date


def test_a_task_sets_its_asset_events_extra_and_the_next_task_starts_without() -> None:
    current = CurrentContext()
    with pytest.raises(ContextError, match="only set inside a running task"):
        current.set_asset_extra("s3://x", {"a": 1})
    current.set(TaskContext(task_id="t"))
    current.set_asset_extra(Asset("s3://x"), {"a": 1})
    current.set_asset_extra("s3://x", {"b": 2})
    assert current.asset_extras() == {"s3://x": {"a": 1, "b": 2}}
    current.set(TaskContext(task_id="next"))
    assert current.asset_extras() == {}
