"""Several schedulers on one Postgres state store: no task is dispatched twice.

Each scheduler applies whatever events it consumes; the run's row lock (FOR UPDATE) makes
readiness of a join be judged once, the conditional UPDATEs make duplicates no-ops, and batch
claims skip rows another scheduler holds (SKIP LOCKED).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import from_url
from tests.conftest import POSTGRES_URL, require_service
from tests.support import RecordingExecutor, conveyor, event, spawn, stop

T0 = 1_700_000_000.0


@pytest.fixture
def state_url(unique: str) -> Iterator[str]:
    require_service("postgres")
    yield f"{POSTGRES_URL}?schema={unique}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(unique)))


def join_dag() -> DAG:
    dag = DAG("join")
    [dag.command("left", ["true"]), dag.command("right", ["true"])] >> dag.command(
        "child", ["true"])
    dag.validate()
    return dag


def test_two_engines_racing_on_a_join_dispatch_the_child_once(state_url: str) -> None:
    dag = join_dag()
    stores = [from_url(state_url), from_url(state_url)]
    executors = [RecordingExecutor(), RecordingExecutor()]
    engines = [Engine(s, {"queue": e}, dags={"join": dag}) for s, e in zip(stores, executors,
                                                                            strict=True)]
    runs = [create_run(stores[0], dag, T0 + i, executors=["queue"]) for i in range(20)]
    engines[0].tick(T0)
    parents = {(w.message.headers["run"], w.message.headers["task_id"]): w
               for w in executors[0].sent}
    executors[0].sent.clear()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def apply(engine: Engine, mine: str, other: str) -> None:
        try:
            for run_id in runs:
                barrier.wait(timeout=10)
                for task_id in (mine, other):   # its own event, then a duplicate of the other
                    engine.handle(event(parents[(run_id, task_id)], "succeeded", T0), T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=apply, args=(engines[0], "left", "right")),
               threading.Thread(target=apply, args=(engines[1], "right", "left"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    children = sorted(w.message.headers["run"] for e in executors for w in e.sent)
    assert children == sorted(runs)        # each child exactly once, none missing
    for store in stores:
        store.close()


def test_two_engines_applying_batches_of_many_runs_dispatch_each_child_once(
        state_url: str) -> None:
    """Each engine applies batches holding events of several runs (its own, and duplicates
    of the other's, in opposite run orders): one transaction per run, so neither waits on a
    lock while holding another, and each join is judged once."""
    dag = join_dag()
    stores = [from_url(state_url), from_url(state_url)]
    executors = [RecordingExecutor(), RecordingExecutor()]
    engines = [Engine(s, {"queue": e}, dags={"join": dag}) for s, e in zip(stores, executors,
                                                                            strict=True)]
    runs = [create_run(stores[0], dag, T0 + i, executors=["queue"]) for i in range(40)]
    engines[0].tick(T0)
    parents = {(w.message.headers["run"], w.message.headers["task_id"]): w
               for w in executors[0].sent}
    executors[0].sent.clear()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def apply(engine: Engine, mine: str, other: str, order: list[str | None]) -> None:
        try:
            for start in range(0, len(order), 8):
                batch = order[start:start + 8]
                barrier.wait(timeout=10)
                engine.handle_many([event(parents[(run_id, task_id)], "succeeded", T0)
                                    for task_id in (mine, other) for run_id in batch], T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=apply, args=(engines[0], "left", "right", runs)),
               threading.Thread(target=apply, args=(engines[1], "right", "left",
                                                    runs[::-1]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    children = sorted(w.message.headers["run"] for e in executors for w in e.sent)
    assert children == sorted(runs)        # each child exactly once, none missing
    for store in stores:
        store.close()


def test_two_scheduler_processes_dispatch_each_task_once(state_url: str,
                                                         tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fan.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('fan', retries=0)\n"
        f"def step(name): return dag.command(name, ['sh', '-c', 'echo ' + name + ' >> {ledger}'])\n"
        "root, join = step('root'), step('join')\n"
        "root >> [step(f't{i}') for i in range(40)] >> join\n")
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": state_url, "CONVEYOR_DAGS_FOLDER": str(dags)}
    procs = [spawn("worker", "--queues", "default", "--concurrency", "4", "--log-level",
                   "WARNING", env=env)]
    procs += [spawn("scheduler", "--log-level", "WARNING", env=env) for _ in range(2)]
    try:
        done = conveyor("dags", "trigger", "fan", "--wait", "--timeout", "60", "--json", env=env)
    finally:
        codes = [stop(proc) for proc in procs]
    assert codes[1:] == [0, 0]             # both schedulers stopped cleanly on SIGTERM
    assert '"state": "success"' in done.stdout
    lines = ledger.read_text().split()
    assert sorted(lines) == sorted(["root", "join"] + [f"t{i}" for i in range(40)])
    store = from_url(state_url)
    try:
        attempts = store.rows("run_attempts", run_id=done.stdout.split('"run_id": "')[1]
                              .split('"')[0])
    finally:
        store.close()
    assert len(attempts) == 42 and {a["attempt"] for a in attempts} == {1}
