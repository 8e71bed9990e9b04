"""A SIGKILLed scheduler's claimed events come back within seconds, not the broker's 60 s.

Two scheduler processes share a Postgres broker and state store. The test holds the run's
row lock so whichever scheduler claims the task's `succeeded` event blocks applying it (a
scheduler busy or stuck with events in hand), finds that scheduler by its Postgres
application name, kills it with SIGKILL, and lets go of the lock: the survivor must apply
the event once the short event lease runs out, and the run must finish with each task run
once.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conveyor.state.store import from_url
from tests.conftest import POSTGRES_URL, require_service
from tests.support import conveyor, spawn, stop, wait_for

LEASE = 2.0


@pytest.fixture
def schemas(unique: str) -> Iterator[tuple[str, str]]:
    require_service("postgres")
    yield f"{unique}s", f"{unique}b"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for name in (f"{unique}s", f"{unique}b"):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(name)))


def write_dag(folder: Path, ledger: Path, go: Path) -> None:
    folder.mkdir()
    (folder / "hold.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('hold', retries=0)\n"
        f"first = dag.command('first', ['sh', '-c', 'while [ ! -f {go} ]; do sleep 0.05; "
        f"done; echo first >> {ledger}'])\n"
        f"first >> dag.command('second', ['sh', '-c', 'echo second >> {ledger}'])\n")


def blocked_scheduler(names: list[str]) -> str | None:
    """The application name of the scheduler whose store connection waits on a lock."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute("SELECT application_name FROM pg_stat_activity "
                           "WHERE wait_event_type = 'Lock' AND application_name = ANY(%s)",
                           (names,)).fetchone()
    return row[0] if row else None


def test_killed_scheduler_events_come_back_within_the_lease(
        schemas: tuple[str, str], tmp_path: Path) -> None:
    state_schema, broker_schema = schemas
    ledger, go = tmp_path / "ledger", tmp_path / "go"
    write_dag(tmp_path / "dags", ledger, go)
    state = f"{POSTGRES_URL}?schema={state_schema}"
    env = {"CONVEYOR_BROKER_URL": f"{POSTGRES_URL}?schema={broker_schema}",
           "CONVEYOR_STATE_URL": state, "CONVEYOR_DAGS_FOLDER": str(tmp_path / "dags"),
           "CONVEYOR_SCHEDULER_EVENT_LEASE": str(LEASE)}
    names = ["sched_a", "sched_b"]
    worker = spawn("worker", "--queues", "default", "--log-level", "WARNING", env=env)
    schedulers = {name: spawn("scheduler", "--log-level", "WARNING", env={
        **env, "CONVEYOR_STATE_URL": f"{state}&application_name={name}"}) for name in names}
    store = from_url(state)
    try:
        run_id = json.loads(conveyor("dags", "trigger", "hold", "--json", env=env).stdout)[
            "run_id"]

        def tis() -> dict[str, str]:
            return {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=run_id)}

        wait_for(lambda: tis()["first"] == "running", what="the first task to start")
        with psycopg.connect(POSTGRES_URL, autocommit=False) as lock:
            lock.execute(sql.SQL("SELECT 1 FROM {}.conveyor_runs WHERE run_id = %s FOR UPDATE")
                         .format(sql.Identifier(state_schema)), (run_id,))
            go.touch()
            holder = wait_for(lambda: blocked_scheduler(names), what="a scheduler to claim "
                              "the success event and wait for the run's lock")
            schedulers[holder].send_signal(signal.SIGKILL)
            schedulers[holder].wait(10)
            killed_at = time.monotonic()
            lock.rollback()
        wait_for(lambda: tis()["first"] == "success", timeout=30,
                 what="the survivor to apply the killed scheduler's event")
        took = time.monotonic() - killed_at
        wait_for(lambda: store.one("run", run_id=run_id)["state"] == "success",
                 what="the run to finish")
    finally:
        store.close()
        for proc in [worker, *schedulers.values()]:
            stop(proc)
    # the lease's lapse, not never: a bound with room for a loaded machine
    assert took < LEASE + 10, f"the event came back {took:.1f} s after the kill"
    assert sorted(ledger.read_text().split()) == ["first", "second"]

