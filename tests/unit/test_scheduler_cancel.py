"""Cancel in DAGs: a cancelled attempt is terminal, `cancel_run` / `cancel_task` on the state
store (SQLite and Postgres, through the `store` fixture), what runs after, idempotence."""

from __future__ import annotations

from conveyor.control import CancelResult, attempt_ref, names, unstarted_ref
from conveyor.scheduler import DAG
from conveyor.scheduler.cancel import cancel_run, cancel_task
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.operations import clear
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


def fan() -> DAG:
    """a and b are roots; c needs both."""
    dag = DAG("fan", retries=2, retry_delay=0)
    c = dag.command("c", ["true"])
    dag.command("a", ["true"]) >> c
    dag.command("b", ["true"]) >> c
    dag.validate()
    return dag


def started(store: Store) -> tuple[Engine, RecordingExecutor, str]:
    dag, executor = fan(), RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"fan": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    return engine, executor, run_id


def states(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=run_id)}


def run_state(store: Store, run_id: str) -> str:
    return str(store.one("run", run_id=run_id)["state"])


def test_a_cancelled_attempt_is_terminal_and_its_run_fails(store: Store) -> None:
    engine, executor, run_id = started(store)
    a = executor.pop("a")
    engine.handle(event(a, "started", T0 + 1), T0 + 1)
    engine.handle(event(a, "cancelled", T0 + 2, reason="cancelled while running"), T0 + 2)
    engine.handle(event(executor.pop("b"), "succeeded", T0 + 3), T0 + 3)
    engine.tick(T0 + 4)
    assert states(store, run_id) == {"a": "cancelled", "b": "success", "c": "upstream_failed"}
    assert run_state(store, run_id) == "failed"
    assert executor.task_ids() == []                      # not retried, c never queued
    outcomes = [r["outcome"] for r in store.rows("run_attempts", run_id=run_id)]
    assert "cancelled" in outcomes
    engine.handle(event(a, "failed", T0 + 5), T0 + 5)     # late: changes nothing
    assert states(store, run_id)["a"] == "cancelled"


def test_cancel_run_cancels_what_is_open_and_ends_the_run_cancelled(store: Store) -> None:
    engine, executor, run_id = started(store)
    a = executor.pop("a")
    engine.handle(event(a, "started", T0 + 1), T0 + 1)
    sent: list[str] = []
    done = cancel_run(store, run_id, T0 + 2, sent.append)
    assert done.result is CancelResult.CANCELLED and done.was == "running"
    assert sorted(done.tasks) == ["a", "b", "c"]
    refs = {attempt_ref(ti["ti_id"], 1) for ti in store.rows("run_tis", run_id=run_id)
            if ti["task_id"] in "ab"}
    assert set(sent) == refs                              # each held attempt, once
    assert states(store, run_id) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    assert run_state(store, run_id) == "cancelled"
    # the worker's report of the stopped attempt changes nothing; nothing is dispatched
    engine.handle(event(a, "cancelled", T0 + 3), T0 + 3)
    engine.handle(event(executor.pop("b"), "succeeded", T0 + 3), T0 + 3)
    engine.tick(T0 + 4)
    assert executor.task_ids() == [] and run_state(store, run_id) == "cancelled"
    # again: says so, changes nothing
    again = cancel_run(store, run_id, T0 + 5, sent.append)
    assert again.result is CancelResult.ALREADY_CANCELLED and len(sent) == 2
    # a clear reopens it: it is no longer cancelled as a whole
    clear(store, run_id, "a", T0 + 6)
    engine.tick(T0 + 6)
    assert executor.task_ids() == ["a"] and run_state(store, run_id) == "running"


def test_cancel_run_of_a_finished_run_changes_nothing(store: Store) -> None:
    engine, executor, run_id = started(store)
    for task_id in ("a", "b"):
        engine.handle(event(executor.pop(task_id), "succeeded", T0 + 1), T0 + 1)
    engine.handle(event(executor.pop("c"), "succeeded", T0 + 2), T0 + 2)
    assert run_state(store, run_id) == "success"
    sent: list[str] = []
    done = cancel_run(store, run_id, T0 + 3, sent.append)
    assert done.result is CancelResult.FINISHED and done.was == "success" and not sent
    assert run_state(store, run_id) == "success"


def test_cancel_task_blocks_its_downstream_and_the_run_fails(store: Store) -> None:
    engine, executor, run_id = started(store)
    sent: list[str] = []
    done = cancel_task(store, run_id, "a", T0 + 1, sent.append)
    assert done.result is CancelResult.CANCELLED and done.was == "queued" and len(sent) == 1
    assert states(store, run_id) == {"a": "cancelled", "b": "queued", "c": "upstream_failed"}
    assert run_state(store, run_id) == "running"
    engine.handle(event(executor.pop("b"), "succeeded", T0 + 2), T0 + 2)
    assert run_state(store, run_id) == "failed"
    assert cancel_task(store, run_id, "a", T0 + 3, sent.append).result \
        is CancelResult.ALREADY_CANCELLED
    assert cancel_task(store, run_id, "b", T0 + 3, sent.append).result \
        is CancelResult.FINISHED
    assert len(sent) == 1


def test_cancel_task_of_a_task_waiting_to_retry_stops_the_retry(store: Store) -> None:
    engine, executor, run_id = started(store)
    engine.handle(event(executor.pop("a"), "failed", T0 + 1), T0 + 1)
    assert states(store, run_id)["a"] == "up_for_retry"
    sent: list[str] = []
    assert cancel_task(store, run_id, "a", T0 + 1, sent.append).result \
        is CancelResult.CANCELLED
    assert not sent                                       # no worker holds it
    engine.tick(T0 + 100)
    assert executor.task_ids() == ["b"]                   # a is never retried


def test_a_dag_attempt_is_cancelled_by_its_attempt_ref(store: Store) -> None:
    _, executor, _ = started(store)
    message = executor.pop("a").message
    assert names({message.run_id}, message, started=True)
    assert names({message.id}, message, started=True)
    assert not names({unstarted_ref(message.id)}, message, started=True)
    assert names({unstarted_ref(message.id)}, message, started=False)
    assert not names({"other"}, message, started=False)
    ti_id, _, attempt = message.run_id.rpartition("/")
    assert attempt_ref(ti_id, int(attempt)) == message.run_id
