"""The records the state repositories return hold every column of their table, in the
table's order, on SQLite and Postgres alike: a column a migration adds and no record field
names would vanish from every JSON document (`readers`), so this fails first."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from conveyor.scheduler.dag import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.monitoring import QueueSamples, Scalers, Schedulers, Workers
from conveyor.state.records import Record, Run, TaskInstance, WorkerRecord
from conveyor.state.runs import Dags, Runs
from conveyor.state.store import Store
from conveyor.state.tasks import Attempts, TaskInstances
from tests.support import RecordingExecutor, event


def test_records_hold_every_column_of_their_row(store: Store) -> None:
    dag = DAG("records")
    dag.command("a", ["true"]) >> dag.command("b", ["true"])
    run_id = create_run(store, dag, 1000.0, executors=["queue"])
    assert run_id is not None
    Dags(store).upsert(dag_id="records", version="v1", file="f.py", schedule=None,
                       timezone="UTC", next_tick=None, now=1000.0)
    Workers(store).beat(worker_id="h:1", hostname="h", pid=1, queues="q", concurrency=2,
                        interval=5.0, started_at=999.0, busy=1, now=1000.0,
                        runners='{"finished": {"q": [1, 0]}}')
    pairs = [(Runs(store).get(run_id), store.one("run", run_id=run_id)),
             (TaskInstances(store).by_task(run_id, "a"),
              store.one("run_ti_by_task", run_id=run_id, task_id="a")),
             (Dags(store).get("records"), store.one("dag_row", dag_id="records")),
             (Workers(store).all()[0], store.one("workers"))]
    for record, row in pairs:
        assert record is not None and row is not None
        assert list(record.doc()) == list(row), type(record).__name__
    for record, row in monitoring_pairs(store):
        assert list(record.doc()) == list(row), type(record).__name__
    worker = Workers(store).all()[0]
    assert isinstance(worker, WorkerRecord) and worker.runners == {"finished": {"q": [1, 0]}}


def test_runs_and_their_task_instances_are_read_many_at_once(store: Store) -> None:
    """What the Celery intake's canvas watcher reads each turn: two queries for any number
    of runs (an unknown id is left out)."""
    dag = DAG("many")
    dag.command("a", ["true"]) >> dag.command("b", ["true"])
    made = [create_run(store, dag, 1000.0 + i, executors=["queue"]) for i in range(3)]
    run_ids = [r for r in made if r is not None]
    found = Runs(store).many([*run_ids[:2], "no-such-run"])
    assert sorted(found) == sorted(run_ids[:2])
    assert all(run.dag_id == "many" for run in found.values())
    tis = TaskInstances(store).of_runs(run_ids[:2])
    assert sorted((ti.run_id, ti.task_id) for ti in tis) == sorted(
        (r, t) for r in run_ids[:2] for t in ("a", "b"))
    assert TaskInstances(store).of_runs([]) == []


def monitoring_pairs(store: Store) -> list[tuple[Record, dict[str, Any]]]:
    """A queue sample, an autoscaler evaluation and change, and a scheduler lease: each
    written through its repository, read back as a record and as the raw row."""
    QueueSamples(store).insert(at=990.0, queue="q", ready=1, in_flight=0, delayed=0, dead=0,
                               succeeded=None, failed=None)
    scalers = Scalers(store)
    scalers.evaluated({"target": "t", "kind": "local", "queues": "q", "replicas": 1,
                       "desired": 2, "min_replicas": 0, "max_replicas": 4, "ready": 5,
                       "in_flight": 0, "reason": "load", "error": None,
                       "polling_interval": 5.0}, 1000.0)
    scalers.scaled(target="t", from_replicas=1, to_replicas=2, reason="load", now=1000.0)
    Schedulers(store).renew(scheduler="s", hostname="h", pid=2, now=1000.0, lease=5.0)
    return [(QueueSamples(store).since(0.0)[0], store.rows("queue_samples", since=0.0)[0]),
            (scalers.all()[0], store.rows("scalers")[0]),
            (scalers.recent_scalings(1)[0], store.rows("recent_scalings", limit=1)[0]),
            (Schedulers(store).all()[0], store.rows("schedulers")[0])]


def test_an_attempt_holds_every_column_of_its_row(store: Store) -> None:
    dag = DAG("attempts")
    dag.command("a", ["true"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"attempts": dag})
    run_id = create_run(store, dag, 1000.0, executors=["queue"])
    assert run_id is not None
    engine.tick(1000.0)
    engine.handle(event(executor.pop("a"), "succeeded", 1001.0, result=[1]), 1001.0)
    [attempt] = Attempts(store).of_run(run_id)
    assert list(attempt.doc()) == list(store.rows("run_attempts", run_id=run_id)[0])
    assert attempt.outcome == "succeeded" and attempt.result == "[1]"


def test_json_columns_are_parsed_once_into_data_and_records_are_frozen(store: Store) -> None:
    dag = DAG("parsed")
    dag.command("a", ["echo", "hi"])
    run_id = create_run(store, dag, 1000.0, executors=["queue"])
    assert run_id is not None
    ti = TaskInstances(store).by_task(run_id, "a")
    assert ti is not None and ti.spec["command"] == ["echo", "hi"]
    assert ti == TaskInstances(store).get(ti.ti_id)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ti.state = "success"  # type: ignore[misc]
    assert {type(r) for r in (ti, Runs(store).get(run_id))} == {TaskInstance, Run}
