"""Callbacks and deadlines through the engine, with a fake clock and a recording executor:
each fires once per transition (also with two engines on one store, and when the event comes
twice), is published by another scheduler when its recorder died before publishing, and a
failing one is recorded and never touches the run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor.control import CancelResult
from conveyor.scheduler import DAG, DagError, Deadline, DeadlineReference
from conveyor.scheduler.alerts import next_time_of_day
from conveyor.scheduler.cancel import cancel_run
from conveyor.scheduler.engine import LEASE, Engine
from conveyor.scheduler.executors import Workload
from conveyor.scheduler.runs import create_run
from conveyor.state.callbacks import Callbacks
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


def near(at: float) -> Any:
    """`at` to the millisecond (pytest.approx's relative default is 30 min at T0)."""
    return pytest.approx(at, abs=1e-3)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = from_url(f"sqlite:///{tmp_path}/state.db")
    yield opened
    opened.close()


@pytest.fixture
def executor() -> RecordingExecutor:
    return RecordingExecutor()


def engine_for(store: Store, executor: RecordingExecutor, dag: DAG) -> Engine:
    return Engine(store, {"queue": executor}, dags={dag.dag_id: dag})


def sent_callbacks(executor: RecordingExecutor) -> list[Workload]:
    """The callbacks sent, removed from the executor's record."""
    found = [w for w in executor.sent if w.message.headers.get("callback")]
    executor.sent = [w for w in executor.sent if not w.message.headers.get("callback")]
    return found


def context(work: Workload) -> dict[str, Any]:
    value = work.message.args[0]
    assert isinstance(value, dict)
    return value


def flaky(**dag_options: Any) -> DAG:
    dag = DAG("flaky", **dag_options)
    dag.task("app.load", retries=2, retry_delay=0, on_retry="app.note_retry",
             on_failure="app.page", on_success="app.cheer")
    return dag


def fail(engine: Engine, work: Workload, at: float, **error: str) -> None:
    engine.handle(event(work, "failed", at, error=error or {
        "type": "HTTPError", "message": "503 from the API", "traceback": "Traceback ..."}), at)


def test_on_retry_per_retry_then_on_failure_once_with_the_error(
        store: Store, executor: RecordingExecutor) -> None:
    dag = flaky(on_failure="app.run_failed")
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    for attempt in (1, 2, 3):
        work = executor.pop("load")
        fail(engine, work, T0 + attempt)
        engine.handle(event(work, "failed", T0 + attempt), T0 + attempt)   # a duplicate
        engine.tick(T0 + attempt + 0.5)
    sent = sent_callbacks(executor)
    assert [(w.message.task, context(w)["kind"], context(w).get("attempt")) for w in sent] == [
        ("app.note_retry", "on_retry", 1), ("app.note_retry", "on_retry", 2),
        ("app.page", "on_failure", 3), ("app.run_failed", "on_failure", None)]
    failure = context(sent[2])
    assert failure["error"] == {"type": "HTTPError", "message": "503 from the API",
                                "traceback": "Traceback ..."}
    assert (failure["dag_id"], failure["run_id"], failure["task_id"]) == ("flaky", run_id,
                                                                          "load")
    assert context(sent[3])["state"] == "failed"
    message = sent[2].message
    assert message.queue == "default" and message.max_retries == 0
    assert message.headers["settle"] == "report" and message.reply_to == engine.events_queue
    assert all(r.state == "published" for r in Callbacks(store).of_run(run_id or ""))


def test_success_fires_the_task_and_dag_callbacks_once(store: Store,
                                                       executor: RecordingExecutor) -> None:
    dag = flaky(on_success="app.run_ok", on_failure="app.run_failed")
    engine = engine_for(store, executor, dag)
    create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.pop("load")
    other = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    engine.handle(event(work, "succeeded", T0 + 1, result=1), T0 + 1)
    other.handle(event(work, "succeeded", T0 + 1, result=1), T0 + 1)   # a second scheduler
    other.tick(T0 + 2)
    kinds = sorted((w.message.task, context(w)["kind"]) for w in sent_callbacks(executor))
    assert kinds == [("app.cheer", "on_success"), ("app.run_ok", "on_success")]


def test_a_timeout_tells_the_callback_its_outcome(store: Store,
                                                  executor: RecordingExecutor) -> None:
    dag = DAG("slow")
    dag.task("app.slow", heartbeat_timeout=10, on_failure="app.page")
    engine = engine_for(store, executor, dag)
    create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("slow"), "started", T0 + 1), T0 + 1)
    engine.tick(T0 + 30)
    (sent,) = sent_callbacks(executor)
    error = context(sent)["error"]
    assert error["type"] == "heartbeat_timeout" and "no heartbeat" in error["message"]


def test_a_scheduler_killed_before_publishing_leaves_it_to_the_next(
        store: Store, executor: RecordingExecutor) -> None:
    dag = flaky()
    dying = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    dying.tick(T0)
    work = executor.pop("load")

    def crash(records: Any) -> None:
        raise KeyboardInterrupt("killed between recording and publishing")
    dying.callbacks.before_publish = crash
    with pytest.raises(KeyboardInterrupt):
        fail(dying, work, T0 + 1)
    assert not sent_callbacks(executor)
    (pending,) = Callbacks(store).of_run(run_id or "")
    assert pending.state == "pending" and pending.claimed_by == dying.scheduler_id

    survivor = engine_for(store, executor, dag)   # the dead one holds no lease row
    lapsed = T0 + 1 + LEASE                       # its claim lasts one lease
    assert survivor.callbacks.next_due() == near(lapsed)
    survivor.tick(lapsed - 1)
    assert not sent_callbacks(executor)
    survivor.tick(lapsed)
    survivor.tick(lapsed + 1)
    assert [context(w)["kind"] for w in sent_callbacks(executor)] == ["on_retry"]
    assert Callbacks(store).of_run(run_id or "")[0].state == "published"


def test_a_failing_callback_is_recorded_and_never_touches_the_run(
        store: Store, executor: RecordingExecutor, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="conveyor.scheduler.callbacks")
    dag = flaky()
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("load"), "succeeded", T0 + 1), T0 + 1)
    (callback,) = sent_callbacks(executor)
    engine.handle(event(callback, "failed", T0 + 2, error={"type": "KeyError",
                                                           "message": "'chat'"}), T0 + 2)
    engine.handle(event(callback, "failed", T0 + 2), T0 + 2)   # a duplicate
    (record,) = Callbacks(store).of_run(run_id or "")
    assert record.state == "failed" and "KeyError" in (record.error or "")
    assert Callbacks(store).failures() == {"on_success": 1}
    assert store.one("run", run_id=run_id)["state"] == "success"
    logged = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(logged) == 1, logged          # once, though its failure came twice
    assert f"app.cheer on_success of run {run_id}" in logged[0]
    assert "KeyError" in logged[0] and "not affected" in logged[0]


def test_a_callback_the_executor_refuses_is_recorded_failed(store: Store) -> None:
    dag = DAG("elsewhere")
    dag.task("app.t", on_success="app.cheer")
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.pop("t")
    engine.executors.clear()     # the executor that ran the task is gone
    engine.handle(event(work, "succeeded", T0 + 1), T0 + 1)
    (record,) = Callbacks(store).of_run(run_id or "")
    assert record.state == "failed" and "not configured" in (record.error or "")


def test_a_tasks_callback_runs_on_its_executor_and_a_dags_on_the_default_one(
        store: Store) -> None:
    """AIP-61: a task's callback goes to the executor that ran the task, a DAG's own
    callback to the scheduler's default (first configured) executor."""
    dag = DAG("split", on_success="app.run_ok")
    dag.task("app.t", executor="local", on_success="app.cheer")
    default, local = RecordingExecutor("queue"), RecordingExecutor("local")
    engine = Engine(store, {"queue": default, "local": local}, dags={dag.dag_id: dag})
    create_run(store, dag, T0, executors=["queue", "local"])
    engine.tick(T0)
    assert default.task_ids() == []
    engine.handle(event(local.pop("t"), "succeeded", T0 + 1), T0 + 1)
    engine.tick(T0 + 2)
    assert [context(w)["kind"] + " " + w.message.task for w in sent_callbacks(local)] == [
        "on_success app.cheer"]
    assert [context(w)["kind"] + " " + w.message.task for w in sent_callbacks(default)] == [
        "on_success app.run_ok"]


def test_cancelling_a_run_fires_on_cancel_through_the_next_tick(
        store: Store, executor: RecordingExecutor) -> None:
    dag = DAG("stoppable", on_cancel="app.run_cancelled")
    dag.task("app.t", on_cancel="app.task_cancelled")
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    outcome = cancel_run(store, run_id or "", T0 + 1, lambda ref: None)
    assert outcome.result is CancelResult.CANCELLED
    assert engine.next_due(T0 + 1) == near(T0 + 1)
    engine.tick(T0 + 1)
    kinds = sorted(w.message.task for w in sent_callbacks(executor))
    assert kinds == ["app.run_cancelled", "app.task_cancelled"]


def deadline_dag(reference: Any, interval: float = 60) -> DAG:
    dag = DAG("nightly", deadline=Deadline(reference=reference, interval=interval,
                                           callback="app.late"))
    dag.task("app.t")
    return dag


def test_a_missed_deadline_fires_once_without_any_worker(store: Store,
                                                         executor: RecordingExecutor) -> None:
    dag = deadline_dag(DeadlineReference.QUEUED_AT, 60)
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    executor.pop("t")    # published, never started: no worker
    assert engine.next_due(T0 + 1) == near(T0 + 60)
    engine.tick(T0 + 59)
    assert not sent_callbacks(executor)
    engine.tick(T0 + 61)
    other = engine_for(store, executor, dag)
    other.tick(T0 + 62)
    engine.tick(T0 + 63)
    (sent,) = sent_callbacks(executor)
    assert sent.message.task == "app.late" and context(sent)["kind"] == "deadline"
    assert context(sent)["deadline_at"] == near(T0 + 60)
    run = store.one("run", run_id=run_id)
    assert run["deadline_missed_at"] == near(T0 + 61)
    assert Callbacks(store).deadlines_missed() == 1
    assert engine.next_due(T0 + 63) == near(T0 + 605)   # the attempt's queued timeout


def test_a_run_that_ends_in_time_misses_nothing(store: Store,
                                                executor: RecordingExecutor) -> None:
    dag = deadline_dag(DeadlineReference.LOGICAL_DATE, 60)
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"], logical_date=T0 - 30)
    assert store.one("run", run_id=run_id)["deadline_at"] == near(T0 + 30)
    engine.tick(T0)
    engine.handle(event(executor.pop("t"), "succeeded", T0 + 1), T0 + 1)
    engine.tick(T0 + 100)
    assert not sent_callbacks(executor)
    assert store.one("run", run_id=run_id)["deadline_missed_at"] is None


def test_time_of_day_reference_is_the_next_such_time_after_the_logical_date(
        store: Store) -> None:
    logical = datetime(2026, 11, 29, 7, 0, tzinfo=UTC).timestamp()
    dag = deadline_dag(DeadlineReference.time_of_day("06:00"), 600)
    run_id = create_run(store, dag, logical, executors=["queue"], logical_date=logical)
    expected = datetime(2026, 11, 30, 6, 10, tzinfo=UTC).timestamp()
    assert store.one("run", run_id=run_id)["deadline_at"] == near(expected)
    paris = next_time_of_day("06:00", "Europe/Paris", logical)
    assert paris == datetime(2026, 11, 30, 5, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("build, words", [
    (lambda: DAG("d", on_failure=42), "on_failure must be a registered task"),
    (lambda: DAG("d").task("app.t", on_retry=[1]), "on_retry must be a registered task"),
    (lambda: DAG("d", deadline="soon"), "deadline must be a Deadline"),
    (lambda: DAG("d", deadline=Deadline(DeadlineReference.QUEUED_AT, timedelta(-1))),
     "interval must be a timedelta or seconds >= 0"),
    (lambda: DAG("d", deadline=Deadline("logical", 5)), "reference must be one of"),
])
def test_declaration_errors_name_the_line(build: Any, words: str) -> None:
    with pytest.raises(DagError, match=words) as caught:
        build()
    assert "test_scheduler_callbacks.py" in str(caught.value)


def test_time_of_day_refuses_what_is_not_a_time() -> None:
    with pytest.raises(Exception, match="HH:MM"):
        DeadlineReference.time_of_day("6 am")


def test_metrics_count_missed_deadlines_and_failed_callbacks_from_the_store(
        tmp_path: Path, store: Store, executor: RecordingExecutor) -> None:
    from conveyor.scheduler.metrics import StateCollector

    dag = deadline_dag(DeadlineReference.QUEUED_AT, 1)
    engine = engine_for(store, executor, dag)
    create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.tick(T0 + 2)
    (late,) = sent_callbacks(executor)
    engine.handle(event(late, "failed", T0 + 3, error={"type": "OSError", "message": "x"}),
                  T0 + 3)
    families = {f.name: f for f in StateCollector(f"sqlite:///{tmp_path}/state.db").collect()}
    assert [s.value for s in families["conveyor_deadline_missed"].samples
            if s.name.endswith("_total")] == [1.0]
    assert [(s.labels, s.value) for s in families["conveyor_callback_failures"].samples
            if s.name.endswith("_total")] == [({"kind": "deadline"}, 1.0)]


def test_a_cleared_task_and_its_run_fire_again_when_they_end_again(
        store: Store, executor: RecordingExecutor) -> None:
    from conveyor.scheduler.operations import clear

    dag = DAG("again", on_failure="app.run_failed")
    dag.task("app.t", on_failure="app.page")
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"]) or ""
    for at in (T0, T0 + 10):
        engine.tick(at)
        fail(engine, executor.pop("t"), at + 1)
        if at == T0:
            clear(store, run_id, "t", at + 2)
    kinds = sorted((r.attempt, r.ti_id != "", r.kind) for r in Callbacks(store).of_run(run_id))
    assert kinds == [(1, False, "on_failure"), (1, True, "on_failure"),   # (run's, task's)
                     (2, False, "on_failure"), (2, True, "on_failure")]


def test_a_mapped_instance_tells_its_callback_its_index(store: Store,
                                                        executor: RecordingExecutor) -> None:
    dag = DAG("mapped")
    extract = dag.task("p.extract", id="extract")
    dag.task("p.process", on_failure="app.page").expand(item=extract)
    engine = engine_for(store, executor, dag)
    create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("extract"), "succeeded", T0 + 1, result=["a", "b"]),
                  T0 + 1)
    fail(engine, executor.pop("process[1]"), T0 + 2)
    (sent,) = sent_callbacks(executor)
    assert (context(sent)["task_id"], context(sent)["map_index"]) == ("process[1]", 1)


def test_a_backfill_run_has_the_dags_callbacks_but_no_deadline(store: Store) -> None:
    from conveyor.scheduler.operations import backfill

    dag = DAG("daily", schedule="0 3 * * *", on_failure="app.page",
              deadline=Deadline(DeadlineReference.LOGICAL_DATE, 3600, "app.late"))
    dag.command("t", ["true"])
    (run_id,), _ = backfill(store, dag, T0 - 86400, T0, T0, executors=["queue"])
    run = store.one("run", run_id=run_id)
    assert run["deadline_at"] is None and "on_failure" in run["alerts"]


def test_runs_show_and_the_dashboard_say_the_deadline_was_missed(
        tmp_path: Path, store: Store, executor: RecordingExecutor,
        capsys: pytest.CaptureFixture[str]) -> None:
    from conveyor.cli.runs import show_run
    from conveyor.scheduler.config import SchedulerConfig
    from conveyor.ui.app import Dashboard, UiConfig
    from conveyor.ui.http import Request

    dag = deadline_dag(DeadlineReference.QUEUED_AT, 60)
    engine = engine_for(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"]) or ""
    engine.tick(T0)
    engine.tick(T0 + 75)
    show_run(store, run_id, as_json=False)
    text = capsys.readouterr().out
    assert "deadline 2023-11-14T22:14:20.000+00:00: MISSED (found 15 s after it" in text
    assert "deadline of run -> app.late on default: published" in text
    show_run(store, run_id, as_json=True)
    shown = json.loads(capsys.readouterr().out)
    assert shown["deadline"] == {"at": T0 + 60, "missed_at": T0 + 75, "missed": True,
                                 "status": "missed"}
    assert [c["kind"] for c in shown["callbacks"]] == ["deadline"]
    ui = Dashboard(UiConfig(SchedulerConfig.from_env(
        {}, broker_url=f"sqlite:///{tmp_path}/broker.db",
        state_url=f"sqlite:///{tmp_path}/state.db"), "", ()))
    try:
        page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
        listing = ui.handle(Request("GET", "/runs", query={"since": "2023-11-01"})
                            ).body.decode()
    finally:
        ui.close()
    assert "deadline missed</span>" in page and "<h2>Callbacks</h2>" in page
    assert "<strong>missed</strong>" in page and "app.late" in page
    assert "deadline missed</span>" in listing


def test_a_dags_on_retry_is_every_tasks_unless_the_task_gives_its_own() -> None:
    dag = DAG("retrying", on_retry="app.note_retry", on_failure="app.run_failed")
    plain = dag.task("app.a")
    own = dag.task("app.b", on_retry="app.b_retry")
    assert plain.spec()["callbacks"] == {"on_retry": {"task": "app.note_retry", "queue": ""}}
    assert own.spec()["callbacks"]["on_retry"]["task"] == "app.b_retry"
    assert dag.callbacks == {"on_failure": {"task": "app.run_failed", "queue": ""}}


def test_an_executor_that_imports_its_tasks_imports_their_callbacks_too() -> None:
    from conveyor.scheduler.daemon import task_modules
    from conveyor.scheduler.examples import revenue
    from tests.integration import worker_tasks

    dag = DAG("local_alerts", on_failure=worker_tasks.noop)
    dag.command("c", ["true"], executor="local", on_failure=revenue.extract_orders)
    assert task_modules({dag.dag_id: dag}, "local", "queue") == [revenue.__name__]
    assert task_modules({dag.dag_id: dag}, "queue", "queue") == [worker_tasks.__name__]
