"""A deferred attempt in the engine and the store, without processes: recorded with its
trigger, claimed by one triggerer of two, fired once, resumed as the same attempt with the
payload in its message; failed `timed_out` at its timeout; and no longer run by a
triggerer once its task is cancelled. (tests/integration/test_triggerer.py runs it all
with a real scheduler, worker and triggerers.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.records import Transition
from conveyor.state.store import Store, from_url
from conveyor.state.tasks import TaskInstances
from conveyor.state.triggers import Triggers
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0
DEFERRAL = {"classpath": "conveyor.triggers.builtin:FileTrigger",
            "kwargs": {"path": "/in/orders.csv", "poll_interval": 0.5}, "timeout": 60}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = from_url(f"sqlite:///{tmp_path}/state.db")
    yield opened
    opened.close()


def deferred(store: Store) -> tuple[Engine, RecordingExecutor, str]:
    """An engine whose one task started and deferred on DEFERRAL at T0 + 1."""
    dag = DAG("landing")
    dag.task("landing.wait", retries=0)
    dag.validate(["queue"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id
    engine.tick(T0)
    work = executor.pop("wait")
    engine.handle(event(work, "started", T0 + 0.5), T0 + 0.5)
    engine.handle(event(work, "deferred", T0 + 1, result=DEFERRAL), T0 + 1)
    return engine, executor, run_id


def test_a_trigger_fires_once_of_two_triggerers_and_its_task_resumes_with_the_payload(
        store: Store) -> None:
    engine, executor, run_id = deferred(store)
    (ti,) = TaskInstances(store).of_run(run_id)
    assert (ti.state, ti.deadline) == ("deferred", T0 + 61)
    triggers = Triggers(store)
    (claimed,) = triggers.claim("a", now=T0 + 2, lease=10, limit=100)
    assert triggers.claim("b", now=T0 + 2, lease=10, limit=100) == []   # a holds it
    assert claimed.kwargs == DEFERRAL["kwargs"]
    assert triggers.fire("b", [(claimed, {"size": 1})], now=T0 + 3) == []   # not b's
    assert triggers.fire("a", [(claimed, {"size": 7})], now=T0 + 3) == [claimed]
    assert triggers.fire("a", [(claimed, {"size": 7})], now=T0 + 3) == []   # once
    engine.tick(T0 + 3)
    work = executor.pop("wait")
    assert work.message.attempt == 1                      # the same attempt, a new segment
    assert json.loads(work.message.headers["trigger_event"]) == {"size": 7}
    assert TaskInstances(store).of_run(run_id)[0].state == "queued"
    assert triggers.state(ti.ti_id, 1) is None            # forgotten once resumed


def test_a_trigger_not_fired_by_its_timeout_fails_its_task_timed_out(store: Store) -> None:
    engine, executor, run_id = deferred(store)
    engine.tick(T0 + 62)
    (ti,) = TaskInstances(store).of_run(run_id)
    assert ti.state == "failed" and ti.error and ti.error.startswith("timed_out: deferred on")
    assert executor.task_ids() == []


def test_a_cancelled_deferred_task_is_run_by_no_triggerer(store: Store) -> None:
    engine, _, run_id = deferred(store)
    triggers = Triggers(store)
    (ti,) = TaskInstances(store).of_run(run_id)
    assert len(triggers.claim("a", now=T0 + 2, lease=10, limit=100)) == 1
    TaskInstances(store).cancelled(Transition(ti.ti_id, 1, T0 + 3, T0 + 3), error="by hand")
    assert triggers.renew("a", now=T0 + 4, lease=10) == set()   # a stops running it
    assert triggers.claim("b", now=T0 + 20, lease=10, limit=100) == []
