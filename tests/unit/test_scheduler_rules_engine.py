"""Trigger rules and branches applied by the engine, on SQLite and Postgres (the queries
differ): what starts, what is skipped or upstream_failed, how a run ends, and that applying
the same outcome twice (a redelivered event, a second scheduler) queues nothing twice."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conveyor.scheduler import DAG
from conveyor.scheduler import operations as ops
from conveyor.scheduler.cancel import cancel_task
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import SQLiteStore, Store, from_url
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


def states(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=run_id)}


def run_state(store: Store, run_id: str) -> str:
    return str(store.one("run", run_id=run_id)["state"])


def start(store: Store, dag: DAG) -> tuple[Engine, RecordingExecutor, str]:
    dag.validate(["queue"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id
    engine.tick(T0)
    return engine, executor, run_id


def finish(engine: Engine, executor: RecordingExecutor, task_id: str, kind: str = "succeeded",
           result: Any = None, at: float = T0 + 1) -> None:
    work = executor.pop(task_id)
    engine.handle(event(work, "started", at), at)
    fields: dict[str, Any] = {"result": result} if kind == "succeeded" else {
        "error": {"type": "ValueError", "message": "boom"}}
    engine.handle(event(work, kind, at + 0.01, **fields), at + 0.01)


def test_cleanup_all_done_and_alert_one_failed_run_after_a_failure(store: Store) -> None:
    dag = DAG("etl")
    extract = dag.command("extract", ["false"])
    load = dag.command("load", ["true"])
    report = dag.command("report", ["true"])
    cleanup = dag.command("cleanup", ["true"], trigger_rule="all_done")
    alert = dag.command("alert", ["true"], trigger_rule="one_failed")
    extract >> load >> report
    extract >> [cleanup, alert]
    engine, executor, run_id = start(store, dag)
    finish(engine, executor, "extract", "failed")
    assert states(store, run_id) == {"extract": "failed", "load": "upstream_failed",
                                     "report": "upstream_failed", "cleanup": "queued",
                                     "alert": "queued"}
    assert sorted(executor.task_ids()) == ["alert", "cleanup"]
    finish(engine, executor, "cleanup")
    finish(engine, executor, "alert")
    assert run_state(store, run_id) == "failed"     # a failed task fails the run


def test_skips_propagate_and_a_run_of_successes_and_skips_succeeds(store: Store) -> None:
    dag = DAG("skips")
    check = dag.command("check", ["true"])
    when_failed = dag.command("when_failed", ["true"], trigger_rule="all_failed")
    after = dag.command("after", ["true"])                      # all_success: skipped
    tolerant = dag.command("tolerant", ["true"], trigger_rule="none_failed")
    check >> when_failed >> after >> tolerant
    engine, executor, run_id = start(store, dag)
    finish(engine, executor, "check")
    assert states(store, run_id) == {"check": "success", "when_failed": "skipped",
                                     "after": "skipped", "tolerant": "queued"}
    finish(engine, executor, "tolerant")
    assert run_state(store, run_id) == "success"


def test_one_alert_waits_for_nothing_and_always_starts_at_once(store: Store) -> None:
    dag = DAG("early")
    a = dag.command("a", ["true"])
    b = dag.command("b", ["true"])
    first = dag.command("first", ["true"], trigger_rule="one_success")
    watcher = dag.command("watcher", ["true"], trigger_rule="always")
    [a, b] >> first
    [a, b] >> watcher
    engine, executor, run_id = start(store, dag)
    assert sorted(executor.task_ids()) == ["a", "b", "watcher"]
    finish(engine, executor, "a")
    assert states(store, run_id)["first"] == "queued"          # b still running


def branch_dag(**join: Any) -> DAG:
    dag = DAG("branchy")
    choose = dag.branch("flows.choose")
    full = dag.command("full", ["true"])
    incremental = dag.command("incremental", ["true"])
    after_full = dag.command("after_full", ["true"])
    done = dag.command("join", ["true"], **join)
    choose >> [full, incremental]
    full >> after_full
    [after_full, incremental] >> done
    return dag


def test_a_branch_follows_what_it_returns_and_skips_the_rest(store: Store) -> None:
    engine, executor, run_id = start(store, branch_dag(
        trigger_rule="none_failed_min_one_success"))
    finish(engine, executor, "choose", result="incremental")
    assert states(store, run_id) == {"choose": "success", "full": "skipped",
                                     "incremental": "queued", "after_full": "skipped",
                                     "join": "pending"}
    finish(engine, executor, "incremental")
    assert states(store, run_id)["join"] == "queued"
    finish(engine, executor, "join")
    assert run_state(store, run_id) == "success"


def test_a_join_with_the_default_rule_after_a_branch_is_skipped(store: Store) -> None:
    engine, executor, run_id = start(store, branch_dag())
    finish(engine, executor, "choose", result=["full"])
    finish(engine, executor, "full")
    finish(engine, executor, "after_full")
    assert states(store, run_id)["join"] == "skipped"
    assert run_state(store, run_id) == "success"


def test_a_direct_downstream_below_a_followed_task_is_not_skipped(store: Store) -> None:
    dag = DAG("shortcut")
    choose = dag.branch("flows.choose")
    a = dag.command("a", ["true"])
    b = dag.command("b", ["true"])
    join = dag.command("join", ["true"], trigger_rule="none_failed_min_one_success")
    choose >> [a, b, join]
    a >> join
    engine, executor, run_id = start(store, dag)
    finish(engine, executor, "choose", result="a")
    assert states(store, run_id) == {"choose": "success", "a": "queued", "b": "skipped",
                                     "join": "pending"}


@pytest.mark.parametrize(("returned", "words"), [
    ("nope", "returned 'nope': not a direct downstream task of it (its direct downstream "
             "tasks: full, incremental)"),
    ("after_full", "'after_full': not a direct downstream"),
    (42, "returned 42: a branch returns the id of a direct downstream task"),
])
def test_a_branch_returning_what_is_not_a_direct_downstream_fails(
        store: Store, returned: Any, words: str) -> None:
    engine, executor, run_id = start(store, branch_dag())
    finish(engine, executor, "choose", result=returned)
    ti = store.one("run_ti_by_task", run_id=run_id, task_id="choose")
    assert ti["state"] == "failed" and words in ti["error"]
    assert ti["error"].startswith("BranchError: branch task 'choose'")
    assert states(store, run_id)["full"] == "upstream_failed"
    assert run_state(store, run_id) == "failed"


def test_a_branch_returning_none_follows_nothing(store: Store) -> None:
    engine, executor, run_id = start(store, branch_dag())
    finish(engine, executor, "choose", result=None)
    assert set(states(store, run_id).values()) == {"success", "skipped"}
    assert run_state(store, run_id) == "success"


def test_the_same_outcome_applied_twice_queues_each_child_once(store: Store) -> None:
    dag = DAG("twice")
    a = dag.command("a", ["true"])
    dag.command("b", ["true"], trigger_rule="all_done", upstream=[a])
    engine, executor, run_id = start(store, dag)
    work = executor.pop("a")
    failed = event(work, "failed", T0 + 1, error={"type": "E", "message": "x"})
    engine.handle(failed, T0 + 1)
    engine.handle(failed, T0 + 2)      # redelivered, or seen by a second scheduler
    other = Engine(store, {"queue": executor}, dags={"twice": dag})
    other.handle(failed, T0 + 3)
    other.tick(T0 + 3)
    assert executor.task_ids() == ["b"]
    assert store.one("run_ti_by_task", run_id=run_id, task_id="b")["attempt"] == 1


def test_clearing_a_task_skipped_by_a_branch_skips_it_again(store: Store) -> None:
    engine, executor, run_id = start(store, branch_dag(trigger_rule="none_failed"))
    finish(engine, executor, "choose", result="incremental")
    finish(engine, executor, "incremental")
    finish(engine, executor, "join")
    assert ops.clear(store, run_id, "full", T0 + 5) == ["full", "after_full", "join"]
    assert states(store, run_id)["full"] == "skipped"      # the branch still says so
    engine.tick(T0 + 6)
    assert executor.task_ids() == ["join"]                  # join runs again
    finish(engine, executor, "join", at=T0 + 7)
    assert run_state(store, run_id) == "success"


def test_clearing_the_branch_lets_it_choose_again(store: Store) -> None:
    engine, executor, run_id = start(store, branch_dag(trigger_rule="none_failed"))
    finish(engine, executor, "choose", result="incremental")
    finish(engine, executor, "incremental")
    finish(engine, executor, "join")
    ops.clear(store, run_id, "choose", T0 + 5)
    assert set(states(store, run_id).values()) == {"pending"}
    engine.tick(T0 + 6)
    finish(engine, executor, "choose", result="full", at=T0 + 7)
    assert states(store, run_id)["incremental"] == "skipped"
    assert states(store, run_id)["full"] == "queued"


def test_marking_a_skipped_task_success_lets_what_is_below_run(store: Store) -> None:
    engine, executor, run_id = start(store, branch_dag())
    finish(engine, executor, "choose", result="incremental")
    ops.mark(store, run_id, "full", "success", T0 + 5)
    engine.tick(T0 + 6)
    assert executor.task_ids() == ["incremental", "after_full"]


def test_mark_failed_judges_the_children_by_their_rules(store: Store) -> None:
    dag = DAG("marked")
    a = dag.command("a", ["true"])
    dag.command("b", ["true"], upstream=[a])
    dag.command("c", ["true"], upstream=[a], trigger_rule="all_failed")
    engine, executor, run_id = start(store, dag)
    ops.mark(store, run_id, "a", "failed", T0 + 1)
    assert states(store, run_id) == {"a": "failed", "b": "upstream_failed", "c": "pending"}
    engine.tick(T0 + 2)
    assert executor.task_ids() == ["a", "c"]     # a's attempt in flight; c ready


def test_cancelling_a_task_starts_its_all_done_cleanup(store: Store) -> None:
    dag = DAG("cancelled")
    a = dag.command("a", ["sleep", "60"])
    dag.command("b", ["true"], upstream=[a])
    dag.command("cleanup", ["true"], upstream=[a], trigger_rule="all_done")
    engine, executor, run_id = start(store, dag)
    executor.pop("a")
    cancel_task(store, run_id, "a", T0 + 1, lambda ref: None)
    assert states(store, run_id) == {"a": "cancelled", "b": "upstream_failed",
                                     "cleanup": "pending"}
    engine.tick(T0 + 2)
    assert executor.task_ids() == ["cleanup"]
    finish(engine, executor, "cleanup", at=T0 + 3)
    assert run_state(store, run_id) == "failed"


def test_a_failure_that_will_be_retried_triggers_nothing_below_it(store: Store) -> None:
    dag = DAG("retried")
    a = dag.command("a", ["false"], retries=1, retry_delay=0)
    dag.command("alert", ["true"], upstream=[a], trigger_rule="one_failed")
    dag.command("cleanup", ["true"], upstream=[a], trigger_rule="all_done")
    engine, executor, run_id = start(store, dag)
    finish(engine, executor, "a", "failed")
    assert states(store, run_id) == {"a": "up_for_retry", "alert": "pending",
                                     "cleanup": "pending"}
    engine.tick(T0 + 5)
    finish(engine, executor, "a", "failed", at=T0 + 6)
    assert sorted(executor.task_ids()) == ["alert", "cleanup"]


def test_a_branch_marked_success_without_running_skips_nothing(store: Store) -> None:
    """As in Airflow: no choice recorded, so the rules alone decide below it."""
    engine, executor, run_id = start(store, branch_dag())
    executor.pop("choose")
    ops.mark(store, run_id, "choose", "success", T0 + 1)
    engine.tick(T0 + 2)
    assert sorted(executor.task_ids()) == ["full", "incremental"]


def test_a_branch_is_found_whatever_the_spec_json_looks_like(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readiness counts branches by the `is_branch` column: specs written with json.dumps's
    compact separators (no `"branch": {` in their text) still branch."""
    compact = SimpleNamespace(dumps=partial(json.dumps, separators=(",", ":")))
    monkeypatch.setattr("conveyor.scheduler.runs.json", compact)
    engine, executor, run_id = start(store, branch_dag())
    assert '"branch":{' in str(store.one("run_ti_by_task", run_id=run_id,
                                         task_id="choose")["spec"])
    finish(engine, executor, "choose", result="full")
    assert states(store, run_id)["incremental"] == "skipped"


def test_runs_created_before_the_is_branch_column_get_it_from_their_specs(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    old = SQLiteStore(url)
    with old.transaction():                      # a store at migration 14, with a run
        old._script(old.queries["schema_table"])
        for n in range(1, 15):
            old._script(old.queries[f"migration_{n:04d}"])
        old.exec("set_schema_version", version=14)
        old.queries = {**old.queries, "insert_ti": old.queries["insert_ti"].replace(
            ", is_branch)", ")").replace(", :is_branch)", ")")}   # (a copy: it is cached)
        run_id = create_run(old, branch_dag(), T0, executors=["queue"])
    old.close()
    store = from_url(url)
    try:
        flags = {r["task_id"]: r["is_branch"] for r in store.rows("run_tis", run_id=run_id)}
        assert flags == {"choose": 1, "full": 0, "incremental": 0, "after_full": 0, "join": 0}
    finally:
        store.close()


def skip_dag() -> DAG:
    dag = DAG("skipping")
    check = dag.command("check", ["true"], retries=2)
    report = dag.command("report", ["true"])
    publish = dag.command("publish", ["true"], trigger_rule="none_failed")
    alert = dag.command("alert", ["true"], trigger_rule="one_failed")
    check >> [report, publish, alert]
    report >> dag.command("after_report", ["true"])
    return dag


def skip(engine: Engine, executor: RecordingExecutor, task_id: str, at: float = T0 + 1
         ) -> Any:
    work = executor.pop(task_id)
    engine.handle(event(work, "started", at), at)
    engine.handle(event(work, "skipped", at + 0.01, reason="nothing new today"), at + 0.01)
    return work


def test_a_task_that_skips_itself_is_skipped_not_retried_and_its_children_follow_rules(
        store: Store) -> None:
    engine, executor, run_id = start(store, skip_dag())
    skip(engine, executor, "check")
    assert states(store, run_id) == {"check": "skipped", "report": "skipped",
                                     "publish": "queued", "alert": "skipped",
                                     "after_report": "skipped"}
    check = store.one("run_ti_by_task", run_id=run_id, task_id="check")
    assert check["attempt"] == 1 and check["error"] == "nothing new today"
    assert [(a["outcome"], a["error"]) for a in store.rows("run_attempts", run_id=run_id)] \
        == [("skipped", "nothing new today")]
    engine.tick(T0 + 600)                          # past any retry delay: nothing is retried
    assert executor.task_ids() == ["publish"]
    finish(engine, executor, "publish", at=T0 + 601)
    assert run_state(store, run_id) == "success"


def test_a_skip_applied_twice_queues_each_child_once(store: Store) -> None:
    engine, executor, run_id = start(store, skip_dag())
    work = skip(engine, executor, "check")
    engine.handle(event(work, "skipped", T0 + 2, reason="again"), T0 + 2)
    assert executor.task_ids() == ["publish"]
    assert len(store.rows("run_attempts", run_id=run_id)) == 1


def test_a_skip_of_an_attempt_already_ended_changes_nothing(store: Store) -> None:
    """A late skip (the attempt timed out and was retried meanwhile) is ignored."""
    engine, executor, run_id = start(store, skip_dag())
    work = executor.pop("check")
    finish_at = T0 + 1
    engine.handle(event(work, "failed", finish_at, error={"type": "E", "message": "x"}),
                  finish_at)
    engine.handle(event(work, "skipped", finish_at + 1, reason="late"), finish_at + 1)
    assert states(store, run_id)["check"] == "up_for_retry"


def test_a_command_task_skips_on_exit_99_unless_told_otherwise() -> None:
    from conveyor.scheduler.workloads import workload
    from tests.support import task_instance

    dag = DAG("codes")
    dag.command("default", ["true"])
    dag.command("several", ["true"], skip_on_exit_code=[3, 99])
    dag.command("never", ["true"], skip_on_exit_code=None)

    def header(task_id: str) -> str | None:
        spec = {**dag.tasks[task_id].spec(), "downstream": []}
        message = workload(task_instance(task_id=task_id, spec=spec), "events").message
        return message.headers.get("skip_exit_codes")

    assert (header("default"), header("several"), header("never")) == ("99", "3,99", None)


@pytest.mark.parametrize("given", [0, 256, "99", [1, "2"], True])
def test_a_skip_exit_code_that_is_not_one_fails_at_its_line(given: Any) -> None:
    from conveyor.scheduler.errors import DagError

    with pytest.raises(DagError, match="skip_on_exit_code must be an exit code"):
        DAG("bad").command("a", ["true"], skip_on_exit_code=given)


def test_runs_show_lists_a_skip_with_its_reason_not_as_a_failed_attempt(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    from conveyor.cli.runs import show_run

    engine, executor, run_id = start(store, skip_dag())
    skip(engine, executor, "check")
    show_run(store, run_id, False)
    shown = capsys.readouterr().out
    assert "nothing new today" in shown and "failed attempts" not in shown
