"""Pause, clear and mark on the state store, through the engine, on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.errors import DagError, RunError
from conveyor.scheduler.operations import backfill, clear, mark, retry_now, set_paused
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


def chain(retries: int = 0) -> DAG:
    dag = DAG("chain", retries=retries, retry_delay=0)
    dag.command("a", ["true"]) >> dag.command("b", ["true"]) >> dag.command("c", ["true"])
    dag.validate()
    return dag


def states(store: Store, run_id: str) -> dict[str, tuple[str, int]]:
    return {r["task_id"]: (r["state"], r["attempt"]) for r in store.rows("run_tis", run_id=run_id)}


def finish(engine: Engine, executor: RecordingExecutor, task_id: str, kind: str,
           at: float) -> None:
    engine.handle(event(executor.pop(task_id), kind, at), at)
    engine.tick(at)


def test_clear_reruns_the_task_and_its_downstream_with_fresh_budgets(store: Store) -> None:
    dag, executor = chain(retries=1), RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"chain": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    for task_id in "abc":
        finish(engine, executor, task_id, "succeeded", T0 + 1)
    assert store.one("run", run_id=run_id)["state"] == "success"

    assert clear(store, run_id, "b", T0 + 2) == ["b", "c"]
    assert store.one("run", run_id=run_id)["state"] == "queued"
    engine.tick(T0 + 2)
    assert executor.task_ids() == ["b"]
    finish(engine, executor, "b", "failed", T0 + 3)          # attempt 2 of 3: retried
    finish(engine, executor, "b", "succeeded", T0 + 4)       # attempt 3
    finish(engine, executor, "c", "succeeded", T0 + 5)
    assert states(store, run_id) == {"a": ("success", 1), "b": ("success", 3),
                                     "c": ("success", 2)}
    assert store.one("run", run_id=run_id)["state"] == "success"


def test_clear_refuses_a_task_that_may_still_run(store: Store) -> None:
    dag, executor = chain(), RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"chain": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    with pytest.raises(RunError, match=r"a \(queued, attempt 1\) may still run"):
        clear(store, run_id, "a", T0)
    with pytest.raises(RunError, match="no task 'zz'"):
        clear(store, run_id, "zz", T0)


def test_retry_now_makes_a_waiting_retry_due_at_once_on_the_same_budget(store: Store) -> None:
    dag, executor = DAG("slow_retry", retries=2, retry_delay=3600), RecordingExecutor()
    dag.command("a", ["true"])
    dag.validate()
    engine = Engine(store, {"queue": executor}, dags={"slow_retry": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    with pytest.raises(RunError, match="it is queued, not up_for_retry"):
        retry_now(store, run_id, "a", T0)
    finish(engine, executor, "a", "failed", T0 + 1)
    assert states(store, run_id)["a"] == ("up_for_retry", 1)
    assert "a" not in executor.task_ids()               # an hour to wait

    assert retry_now(store, run_id, "a", T0 + 2).state == "up_for_retry"
    engine.tick(T0 + 2)
    assert states(store, run_id)["a"] == ("queued", 2)
    assert store.one("run_ti_by_task", run_id=run_id, task_id="a")["max_attempts"] == 3
    with pytest.raises(RunError, match="no task 'zz'"):
        retry_now(store, run_id, "zz", T0 + 2)
    with pytest.raises(RunError, match="no run 'nope'"):
        retry_now(store, "nope", "a", T0 + 2)


def test_mark_failed_blocks_below_and_mark_success_unblocks(store: Store) -> None:
    dag, executor = chain(), RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"chain": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    finish(engine, executor, "a", "failed", T0 + 1)
    assert states(store, run_id)["c"] == ("upstream_failed", 0)
    assert store.one("run", run_id=run_id)["state"] == "failed"

    mark(store, run_id, "a", "success", T0 + 2)              # the children may run now
    engine.tick(T0 + 2)
    assert executor.task_ids() == ["b"]
    mark(store, run_id, "b", "failed", T0 + 3)               # in flight: ignored when it ends
    engine.tick(T0 + 3)
    finish(engine, executor, "b", "succeeded", T0 + 4)
    assert states(store, run_id)["b"][0] == "failed"
    assert states(store, run_id)["c"][0] == "upstream_failed"
    assert store.one("run", run_id=run_id)["state"] == "failed"


def test_a_paused_dag_starts_no_runs_and_skips_its_ticks(store: Store) -> None:
    dag = DAG("hourly", schedule="0 * * * *")
    dag.command("a", ["true"])
    dag.validate()
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"hourly": dag})
    engine.sync_dags(T0)
    set_paused(store, dag, True, T0)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0 + 7200)                                   # two ticks passed, paused
    assert executor.task_ids() == []
    assert store.one("run", run_id=run_id)["state"] == "queued"
    assert len(store.rows("recent_runs", dag_id="hourly", state="", limit=10)) == 1
    set_paused(store, dag, False, T0 + 7200)
    engine.tick(T0 + 7200)
    assert executor.task_ids() == ["a"]


def hourly(**options: Any) -> DAG:
    dag = DAG("hourly", schedule="0 * * * *", **options)
    dag.command("a", ["true"])
    dag.validate()
    return dag


START = 1_714_528_800.0          # 2024-05-01T02:00:00Z, on the hour


def test_catch_up_creates_each_missed_tick_a_few_at_a_time(
        store: Store, state_url: str) -> None:
    dag = hourly(start_date=START - 5 * 3600, max_active_runs=2)
    executors = [RecordingExecutor(), RecordingExecutor()]
    other = from_url(state_url)
    engines = [Engine(s, {"queue": e}, dags={"hourly": dag})
               for s, e in zip((store, other), executors, strict=True)]
    for engine in engines:
        engine.sync_dags(START)
    dates: list[float] = []
    for _ in range(4):
        for engine in engines:               # two schedulers: each tick gets one run
            engine.tick(START + 60)
        runs = store.rows("recent_runs", dag_id="hourly", state="", limit=100)
        assert sum(r["state"] in ("queued", "running") for r in runs) <= 2
        for engine, executor in zip(engines, executors, strict=True):
            for work in list(executor.sent):
                engine.handle(event(work, "succeeded", START + 61), START + 61)
            executor.sent.clear()
        dates = sorted(r["logical_date"] for r in runs)
    assert dates == [START - h * 3600 for h in range(5, -1, -1)]   # 6 ticks, once each
    assert engines[0].next_due(START + 60) == START + 3600
    other.close()


def test_backfill_creates_each_tick_of_the_range_once(store: Store) -> None:
    dag = hourly(catchup=False)
    created, existing = backfill(store, dag, START - 3 * 3600, START - 3600, START,
                                 executors=["queue"])
    assert len(created) == 3 and existing == []
    created, existing = backfill(store, dag, START - 4 * 3600, START - 3600, START,
                                 executors=["queue"])
    assert len(created) == 1 and existing == [START - h * 3600 for h in (3, 2, 1)]
    with pytest.raises(RunError, match="has no schedule"):
        backfill(store, DAG("plain"), START, START, START, executors=["queue"])


def test_start_dates_and_run_caps_are_checked_where_the_dag_is_declared() -> None:
    assert hourly(start_date="2024-05-01T02:00:00Z").start_date == START
    assert hourly(start_date="2024-05-01T02:00").start_date == START      # naive: UTC
    with pytest.raises(DagError, match=r"start_date 'yesterday' is not an ISO-8601 date"):
        hourly(start_date="yesterday")
    with pytest.raises(DagError, match="max_active_runs must be a whole number"):
        hourly(max_active_runs=0)


def test_backfilled_runs_start_no_more_than_max_active_runs_at_once(store: Store) -> None:
    dag, executor = hourly(catchup=False, max_active_runs=2), RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"hourly": dag})
    created, _ = backfill(store, dag, START - 5 * 3600, START - 3600, START,
                          executors=["queue"])
    assert len(created) == 5
    started = []
    for _ in range(3):
        engine.tick(START)
        started.append(len(executor.sent))
        runs = store.rows("recent_runs", dag_id="hourly", state="running", limit=10)
        assert len(runs) <= 2
        for work in list(executor.sent):
            engine.handle(event(work, "succeeded", START + 1), START + 1)
        executor.sent.clear()
    assert started == [2, 2, 1]
