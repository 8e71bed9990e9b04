"""The engine's steps with a fake clock and a recording executor, on SQLite in tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.scheduler import DAG
from conveyor.scheduler.engine import START_GRACE, Engine, timeout_reason
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.readiness import Readiness
from conveyor.scheduler.runs import create_run, trigger
from conveyor.state.store import Store, from_url
from conveyor.state.tasks import TaskInstances
from tests.support import RecordingExecutor, event, task_instance

T0 = 1_700_000_000.0
G = START_GRACE   # the scheduler times an attempt out this long after its message expired


def revenue(**defaults: Any) -> DAG:
    dag = DAG("revenue", **defaults)
    orders = dag.task("revenue.extract_orders")
    payments = dag.task("revenue.extract_payments", retries=2, retry_delay=2,
                        retry_jitter=False)
    clean_o = dag.task("revenue.clean_orders")
    clean_p = dag.task("revenue.clean_payments")
    aggregate = dag.task("revenue.aggregate_revenue")
    load = dag.task("revenue.load_dashboard")
    orders >> clean_o
    payments >> clean_p
    [clean_o, clean_p] >> aggregate >> load
    dag.validate(["queue"])
    return dag


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = from_url(f"sqlite:///{tmp_path}/state.db")
    yield opened
    opened.close()


@pytest.fixture
def executor() -> RecordingExecutor:
    return RecordingExecutor()


def make_engine(store: Store, executor: RecordingExecutor, dag: DAG) -> Engine:
    return Engine(store, {"queue": executor}, dags={dag.dag_id: dag})


def states(store: Store, run_id: str) -> dict[str, tuple[str, int]]:
    return {r["task_id"]: (r["state"], r["attempt"]) for r in store.rows("run_tis", run_id=run_id)}


def run_ok(engine: Engine, executor: RecordingExecutor, task_id: str, at: float) -> None:
    work = executor.pop(task_id)
    engine.handle(event(work, "started", at, hostname="w1", pid=42), at)
    engine.handle(event(work, "succeeded", at + 0.01), at + 0.01)


def test_revenue_dag_runs_in_order_and_records_retries(store: Store,
                                                       executor: RecordingExecutor) -> None:
    dag = revenue()
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id and store.one("run", run_id=run_id)["state"] == "queued"

    engine.tick(T0)
    assert sorted(executor.task_ids()) == ["extract_orders", "extract_payments"]
    message = executor.sent[0].message
    assert message.max_retries == 0 and message.headers["settle"] == "report"
    assert message.reply_to == "conveyor.scheduler.events"

    run_ok(engine, executor, "extract_orders", T0 + 1)
    assert executor.task_ids() == ["extract_payments", "clean_orders"]  # child at once

    payments = executor.pop("extract_payments")
    engine.handle(event(payments, "failed", T0 + 2, error={"type": "HTTPError",
                                                            "message": "503"}), T0 + 2)
    assert states(store, run_id)["extract_payments"] == ("up_for_retry", 1)
    assert engine.tick(T0 + 3.9) == pytest.approx(T0 + 4)   # retry_delay 2 s, no jitter
    assert "extract_payments" not in executor.task_ids()
    engine.tick(T0 + 4)
    assert states(store, run_id)["extract_payments"] == ("queued", 2)
    for task_id, at in [("extract_payments", 5), ("clean_orders", 5), ("clean_payments", 6),
                        ("aggregate_revenue", 7), ("load_dashboard", 8)]:
        run_ok(engine, executor, task_id, T0 + at)

    assert store.one("run", run_id=run_id)["state"] == "success"
    attempts = [(a["attempt"], a["outcome"]) for a in store.rows("run_attempts", run_id=run_id)
                if a["ti_id"] == payments.message.headers["ti"]]
    assert attempts == [(1, "failed"), (2, "succeeded")]
    assert engine.runs_finished == 1 and not executor.sent


def test_retry_delays_follow_the_backoff_policy(store: Store,
                                                executor: RecordingExecutor) -> None:
    dag = DAG("flaky")
    dag.command("t", ["false"], retries=4, retry_delay=1, retry_max_delay=5,
                retry_jitter=False)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    now = T0
    engine.tick(now)
    waits = []
    for _ in range(4):
        engine.handle(event(executor.pop("t"), "failed", now), now)
        due = engine.tick(now)
        waits.append(round(due - now, 6))
        now = due
        engine.tick(now)
    assert waits == [1, 2, 4, 5]    # 1 * 2**(n-1), capped at 5
    engine.handle(event(executor.pop("t"), "failed", now), now)
    assert states(store, run_id)["t"] == ("failed", 5)
    assert store.one("run", run_id=run_id)["state"] == "failed"


def test_jitter_stays_within_one_base_delay(store: Store, executor: RecordingExecutor) -> None:
    dag = DAG("jitter")
    dag.command("t", ["false"], retries=1, retry_delay=10)
    engine = make_engine(store, executor, dag)
    create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("t"), "failed", T0), T0)
    due = engine.tick(T0)
    assert due is not None and 10 <= due - T0 <= 20


def test_permanent_failure_marks_everything_downstream(store: Store,
                                                      executor: RecordingExecutor) -> None:
    dag = revenue(retries=0)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("extract_orders"), "oom_killed", T0 + 1,
                        reason="memory limit 1 GiB"), T0 + 1)
    found = states(store, run_id)
    assert found["extract_orders"] == ("failed", 1)
    assert {found[t][0] for t in ("clean_orders", "aggregate_revenue", "load_dashboard")} == \
        {"upstream_failed"}
    assert store.one("run", run_id=run_id)["state"] == "running"   # payments still running
    run_ok(engine, executor, "extract_payments", T0 + 2)
    run_ok(engine, executor, "clean_payments", T0 + 3)
    assert store.one("run", run_id=run_id)["state"] == "failed"
    error = store.one("ti", ti_id=[r for r in store.rows("run_tis", run_id=run_id)
                                   if r["task_id"] == "extract_orders"][0]["ti_id"])["error"]
    assert error.startswith("oom_killed") and "memory limit 1 GiB" in error


def test_duplicate_and_stale_events_change_nothing(store: Store,
                                                   executor: RecordingExecutor) -> None:
    dag = DAG("d")
    a = dag.command("a", ["true"], retries=1, retry_delay=0)
    a >> dag.command("b", ["true"])
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    first = executor.pop("a")
    engine.handle(event(first, "failed", T0), T0)
    engine.tick(T0)
    second = executor.pop("a")
    engine.handle(event(first, "succeeded", T0), T0)         # stale attempt 1: ignored
    engine.handle(event(first, "started", T0), T0)
    assert states(store, run_id)["a"] == ("queued", 2)
    engine.handle(event(second, "succeeded", T0 + 1), T0 + 1)
    engine.handle(event(second, "succeeded", T0 + 1), T0 + 1)  # duplicate: one child only
    engine.handle(event(second, "failed", T0 + 1), T0 + 1)     # late failure: ignored
    assert executor.task_ids() == ["b"]
    assert states(store, run_id)["a"] == ("success", 2)


def test_worker_side_retry_and_interruption_keep_the_attempt(store: Store,
                                                             executor: RecordingExecutor) -> None:
    dag = DAG("d")
    dag.command("a", ["true"])
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.sent[0]
    engine.handle(event(work, "started", T0), T0)
    engine.handle(event(work, "interrupted", T0 + 1, reason="worker shut down"), T0 + 1)
    assert states(store, run_id)["a"] == ("queued", 1)
    engine.handle(event(work, "failed", T0 + 2, retry_in=5.0), T0 + 2)
    assert states(store, run_id)["a"] == ("queued", 1)
    engine.handle(event(work, "started", T0 + 7), T0 + 7)
    engine.handle(event(work, "succeeded", T0 + 8), T0 + 8)
    assert store.one("run", run_id=run_id)["state"] == "success"


def test_queued_timeout_then_zombie_are_retried_with_reasons(store: Store,
                                                            executor: RecordingExecutor) -> None:
    dag = DAG("d")
    dag.command("a", ["true"], retries=2, retry_delay=0, queued_timeout=30,
                heartbeat_timeout=10)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert engine.tick(T0) == T0 + 30 + G
    assert executor.sent[0].message.expires == T0 + 30   # no worker starts it later
    engine.tick(T0 + 29 + G)
    assert states(store, run_id)["a"] == ("queued", 1)
    engine.tick(T0 + 30 + G)                # timed out, then re-queued at once (delay 0)
    assert states(store, run_id)["a"] == ("queued", 2)
    work = executor.sent[-1]
    T1 = T0 + G
    engine.handle(event(work, "started", T1 + 31, hostname="w9", pid=7), T1 + 31)
    engine.handle(event(work, "heartbeat", T1 + 38), T1 + 38)
    assert engine.tick(T1 + 45) == T1 + 48
    engine.tick(T1 + 48)
    assert states(store, run_id)["a"] == ("queued", 3)
    outcomes = [(a["outcome"], a["error"]) for a in store.rows("run_attempts", run_id=run_id)]
    assert outcomes[0][0] == "queued_timeout" and "queue 'default'" in outcomes[0][1]
    assert outcomes[1][0] == "heartbeat_timeout" and "w9 pid 7" in outcomes[1][1]


def test_a_worker_refusing_an_expired_attempt_times_it_out_at_once(
        store: Store, executor: RecordingExecutor) -> None:
    """The worker's `expired` is the timeout, heard before the scheduler's own timer."""
    dag = DAG("d")
    dag.command("a", ["true"], retries=1, retry_delay=0, queued_timeout=30)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.pop("a")
    engine.handle(event(work, "expired", T0 + 31, hostname="w1",
                        reason="not started by its deadline"), T0 + 31)
    engine.tick(T0 + 31)
    assert states(store, run_id)["a"] == ("queued", 2)   # retried at once (delay 0)
    [attempt] = store.rows("run_attempts", run_id=run_id)
    assert attempt["outcome"] == "queued_timeout" and "refused by w1" in attempt["error"]
    engine.handle(event(work, "expired", T0 + 32), T0 + 32)   # again: changes nothing
    assert states(store, run_id)["a"] == ("queued", 2)


def test_an_expired_copy_of_a_running_attempt_changes_nothing(
        store: Store, executor: RecordingExecutor) -> None:
    """A redelivery (or a second publish) of an attempt that started expires unrun: the run
    in progress goes on; its heartbeats decide whether it lives."""
    dag = DAG("d")
    dag.command("a", ["true"], retries=1, retry_delay=0, queued_timeout=30,
                heartbeat_timeout=60)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.pop("a")
    engine.handle(event(work, "started", T0 + 1, hostname="w1"), T0 + 1)
    engine.handle(event(work, "expired", T0 + 40, hostname="w2"), T0 + 40)
    engine.tick(T0 + 40)
    assert states(store, run_id)["a"] == ("running", 1) and not executor.sent
    engine.handle(event(work, "succeeded", T0 + 50), T0 + 50)
    assert states(store, run_id)["a"] == ("success", 1)


def test_a_running_attempt_that_came_back_late_is_published_again(
        store: Store, executor: RecordingExecutor) -> None:
    """Its worker was killed: the redelivery (delivery 2) came after its deadline to start
    and was refused; the same attempt goes out again with a fresh one, as before expiry
    existed the redelivery would have run it."""
    dag = DAG("d")
    dag.command("a", ["true"], retries=0, queued_timeout=30, heartbeat_timeout=600)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.pop("a")
    engine.handle(event(work, "started", T0 + 1, hostname="w1"), T0 + 1)
    engine.handle(event(work, "expired", T0 + 100, hostname="w2", delivery=2), T0 + 100)
    again = executor.pop("a")
    assert (again.message.attempt, again.message.expires) == (1, T0 + 130)
    assert again.message.id != work.message.id
    assert states(store, run_id)["a"] == ("queued", 1)
    engine.handle(event(again, "started", T0 + 101), T0 + 101)
    engine.handle(event(again, "succeeded", T0 + 102), T0 + 102)
    assert states(store, run_id)["a"] == ("success", 1)


def test_a_start_after_the_timeout_is_logged_as_an_error(
        store: Store, executor: RecordingExecutor, caplog: pytest.LogCaptureFixture) -> None:
    """Only a worker clock behind by more than the grace can start a timed-out attempt."""
    dag = DAG("d")
    dag.command("a", ["true"], queued_timeout=30)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    engine.tick(T0 + 30 + G)
    assert states(store, run_id)["a"] == ("failed", 1)
    engine.handle(event(executor.pop("a"), "started", T0 + 40, hostname="w2"), T0 + 40)
    assert "STARTED on w2" in caplog.text and "after it was timed out" in caplog.text


@pytest.fixture
def any_store(state_url: str) -> Iterator[Store]:
    """A state store on SQLite and on Postgres (the queries differ)."""
    opened = from_url(state_url)
    yield opened
    opened.close()


def test_a_task_waiting_for_its_pool_is_not_timed_out_until_it_gets_a_slot(
        any_store: Store, executor: RecordingExecutor) -> None:
    """As Airflow's task waiting for a pool slot stays `scheduled`, untimed: a parked task
    keeps no queued deadline; handed a slot (`unparked`) its queued_timeout starts over."""
    store = any_store
    dag = DAG("d", pools={"warehouse": 1})
    dag.command("a", ["true"], pool="warehouse", queued_timeout=30)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert engine.tick(T0) == T0 + 30 + G
    work = executor.sent[0]
    engine.handle(event(work, "parked", T0 + 1, reason="waiting for a slot of pool:warehouse"),
                  T0 + 1)
    engine.tick(T0 + 3600)
    assert states(store, run_id)["a"] == ("queued", 1)
    engine.handle(event(work, "unparked", T0 + 3600), T0 + 3600)
    engine.tick(T0 + 3629 + G)
    assert states(store, run_id)["a"] == ("queued", 1)
    engine.tick(T0 + 3630 + G)              # handed its slot 30 s ago and still not started
    assert states(store, run_id)["a"] == ("failed", 1)
    [attempt] = store.rows("run_attempts", run_id=run_id)
    assert attempt["outcome"] == "queued_timeout"


def test_a_parked_task_that_starts_runs_as_usual(any_store: Store,
                                                 executor: RecordingExecutor) -> None:
    store = any_store
    dag = DAG("d", pools={"warehouse": 1})
    dag.command("a", ["true"], pool="warehouse", queued_timeout=30)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.sent[0]
    engine.handle(event(work, "parked", T0 + 1), T0 + 1)
    engine.handle(event(work, "unparked", T0 + 900), T0 + 900)
    run_ok(engine, executor, "a", T0 + 901)
    assert states(store, run_id)["a"] == ("success", 1)


def test_a_heartbeat_racing_the_timeout_wins(store: Store, executor: RecordingExecutor) -> None:
    dag = DAG("d")
    dag.command("a", ["true"], heartbeat_timeout=10)
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    work = executor.sent[0]
    engine.handle(event(work, "started", T0), T0)
    due = TaskInstances(store).due(T0 + 10, 10)
    engine.handle(event(work, "heartbeat", T0 + 10), T0 + 10)   # arrives after the scan
    engine._expire(due[0], T0 + 10)
    assert states(store, run_id)["a"] == ("running", 1)


def test_a_claim_of_its_own_seen_failing_is_published_at_its_deadline(
        any_store: Store, executor: RecordingExecutor) -> None:
    """The claim committed but the scheduler saw its session lost (a failover mid-commit),
    so it never published: alive, it publishes its own claim once the claim's deadline
    passes, instead of waiting on itself (it records every publish it makes at once)."""
    store = any_store
    dag = DAG("d")
    dag.command("a", ["true"])
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    me = {"scheduler": engine.scheduler_id, "hostname": "h", "pid": 1, "lease": 60.0}
    store.exec("renew_scheduler", now=T0, **me)                # alive throughout
    with store.transaction():
        store.exec("start_queued_runs", now=T0, limit=10)
        Readiness(TaskInstances(store)).whole_run(run_id, T0, claim={
            "scheduler": engine.scheduler_id, "lease": 5.0})
    assert engine.tick(T0 + 1) == T0 + 5 and not executor.sent
    engine.tick(T0 + 5)
    assert executor.task_ids() == ["a"] and states(store, run_id)["a"] == ("queued", 1)
    assert store.rows("run_tis", run_id=run_id)[0]["published_at"] == T0 + 5


def test_a_dead_schedulers_claim_is_published_once_its_lease_lapses(
        any_store: Store, executor: RecordingExecutor) -> None:
    """Scheduler A claimed an attempt for publishing and died before publishing it: this
    one (B) leaves it alone while A's lease holds, and publishes it once the lease lapses."""
    store = any_store
    dag = DAG("d")
    dag.command("a", ["true"])
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    a = {"scheduler": "A", "hostname": "h", "pid": 1, "lease": 5.0}
    store.exec("renew_scheduler", now=T0, **a)                 # A's lease: until T0 + 5
    with store.transaction():
        store.exec("start_queued_runs", now=T0, limit=10)
        Readiness(TaskInstances(store)).whole_run(run_id, T0,
                                                  claim={"scheduler": "A", "lease": 5.0})
    assert engine.tick(T0 + 1) == T0 + 5 and not executor.sent
    store.exec("renew_scheduler", now=T0 + 3, **a)             # A lives on: until T0 + 8
    assert engine.tick(T0 + 5) == T0 + 8 and not executor.sent
    store.exec("renew_scheduler", now=T0 + 6, **a)             # A's last renewal: T0 + 11
    assert engine.tick(T0 + 8) == T0 + 11 and not executor.sent
    engine.tick(T0 + 11)                                       # A's lease lapsed
    assert executor.task_ids() == ["a"] and states(store, run_id)["a"] == ("queued", 1)
    assert store.rows("run_tis", run_id=run_id)[0]["claimed_by"] == engine.scheduler_id
    assert engine.tick(T0 + 12) == T0 + 611 + G   # published now: the queued timeout runs


def test_executor_refusal_fails_the_attempt(store: Store) -> None:
    executor = RecordingExecutor(refuse=("a",))
    dag = DAG("d")
    dag.command("a", ["true"])
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    assert states(store, run_id)["a"] == ("failed", 1)
    assert "refused a" in store.rows("run_tis", run_id=run_id)[0]["error"]
    assert store.one("run", run_id=run_id)["state"] == "failed"


def test_restarted_engine_never_reruns_a_success(store: Store,
                                                 executor: RecordingExecutor) -> None:
    dag = revenue()
    engine = make_engine(store, executor, dag)
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    run_ok(engine, executor, "extract_orders", T0 + 1)
    fresh = RecordingExecutor()
    restarted = make_engine(store, fresh, dag)   # same store, new process
    restarted.tick(T0 + 2)
    assert fresh.task_ids() == []
    assert states(store, run_id)["extract_orders"] == ("success", 1)


def test_cron_ticks_create_one_run_even_with_two_schedulers(store: Store, tmp_path: Path) -> None:
    dag = DAG("nightly", schedule="0 3 * * *", catchup=False)
    dag.command("a", ["true"])
    other_store = from_url(f"sqlite:///{tmp_path}/state.db")
    first, second = RecordingExecutor(), RecordingExecutor()
    engines = [make_engine(store, first, dag), make_engine(other_store, second, dag)]
    start = 1_714_528_800.0          # 2024-05-01T02:00:00Z
    for engine in engines:
        engine.sync_dags(start)
        assert engine.next_due(start) == start + 3600
    for engine in engines:
        engine.tick(start + 3600 * 30)  # both woke late, no catch-up: the latest tick only
    runs = store.rows("last_runs")
    assert len(runs) == 1 and runs[0]["logical_date"] == start + 3600 * 25
    assert len(first.sent) + len(second.sent) == 1
    assert store.one("dags")["next_tick"] == start + 3600 * 49
    other_store.close()


def test_manual_trigger_for_a_taken_date_is_a_clear_error(store: Store) -> None:
    dag = DAG("d")
    dag.command("a", ["true"])
    trigger(store, dag, T0, executors=["queue"], logical_date=T0)
    with pytest.raises(RunError, match="already has a run for 2023-11-14T22:13:20.000"):
        trigger(store, dag, T0 + 1, executors=["queue"], logical_date=T0)


def test_timeout_reason_texts() -> None:
    queued = task_instance(state="queued", queued_at=0.0, executor="queue", queue="heavy",
                           queued_timeout=600.0)
    assert "queued for 700 s on queue (queue 'heavy')" in timeout_reason(queued, 700.0)[1]
    assert "(limit 600 s + 5 s start grace)" in timeout_reason(queued, 605.0, 5.0)[1]
