"""Deferred tasks end to end: real `conveyor scheduler`, `worker` and `triggerer`
processes on SQLite and on Postgres. Ten tasks deferred on files hold no worker slot (a
one-slot worker runs another DAG's task while they wait), resume with their trigger's
payload once their files appear, and one whose file never comes fails `timed_out`. A
SIGKILLed triggerer's triggers are taken over by a second one, and every task resumes
once (a task run twice would write its line twice)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.store import Store, from_url
from conveyor.state.triggers import Triggers
from tests.integration.dagstack import dag_stack, ledger_lines, trigger_run
from tests.support import spawn, stop, wait_for

WAITERS = 10

DAG_FILE = '''\
from conveyor import DAG, Defer, context, task
from conveyor.triggers import FileTrigger

LEDGER = {ledger!r}
FILES = {files!r}


def note(line):
    with open(LEDGER, "a") as out:
        out.write(line + "\\n")


@task(name="defertest.wait")
def wait(name, timeout):
    event = context.trigger_event
    if event is None:
        note("deferring:" + name)
        raise Defer(FileTrigger(FILES + "/" + name, poll_interval=0.2), timeout=timeout)
    note(f"resumed:{{name}}:{{event['size']}}:{{context.attempt}}")
    return event["size"]


@task(name="defertest.other")
def other():
    note("other")


waits = DAG("waits")
for i in range({waiters}):
    waits.task(wait, id=f"w{{i}}", args=(f"f{{i}}", 300))
waits.task(wait, id="never", args=("never", {never_timeout}))
others = DAG("others")
others.task(other)
'''


def write_dag(tmp_path: Path, never_timeout: float) -> str:
    (tmp_path / "files").mkdir()
    return DAG_FILE.format(ledger=str(tmp_path / "ledger"), files=str(tmp_path / "files"),
                           waiters=WAITERS, never_timeout=never_timeout)


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with dag_stack(state_url, unique, tmp_path, "defertest.py",
                   write_dag(tmp_path, 3)) as made:
        yield made


def states(store: Store, run_id: str) -> dict[str, str]:
    return {row["task_id"]: row["state"] for row in store.rows("run_tis", run_id=run_id)}


def waiting(store: Store, run_id: str) -> int:
    """How many of the waiters (not the one that never gets its file) are deferred."""
    return sum(state == "deferred" for task_id, state in states(store, run_id).items()
               if task_id != "never")


def test_deferred_tasks_free_their_slot_resume_with_the_payload_and_time_out(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "1", env=env)
    scheduler = spawn("scheduler", env=env)
    triggerer = spawn("triggerer", "--poll", "0.2", env=env)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "waits")
        wait_for(lambda: waiting(store, run_id) == WAITERS, timeout=90,
                 what="every waiter deferred", detail=lambda: str(states(store, run_id)))
        trigger_run(env, "others")   # the one slot is free: another DAG's task runs
        wait_for(lambda: "other" in ledger_lines(tmp_path), timeout=60,
                 what="a task to run on the one slot while ten tasks wait")
        assert waiting(store, run_id) == WAITERS
        for i in range(WAITERS):
            (tmp_path / "files" / f"f{i}").write_text("x" * i)
        wait_for(lambda: all(s in ("success", "failed") for s in states(store, run_id).values()),
                 timeout=90, what="every waiter to end", detail=lambda: str(states(store, run_id)))
        tis = {row["task_id"]: row for row in store.rows("run_tis", run_id=run_id)}
    finally:
        store.close()
        for proc in (triggerer, scheduler, worker):
            stop(proc)
    resumed = [line for line in ledger_lines(tmp_path) if line.startswith("resumed:")]
    assert sorted(resumed) == sorted(f"resumed:f{i}:{i}:1" for i in range(WAITERS))
    assert all(tis[f"w{i}"]["state"] == "success" for i in range(WAITERS))
    assert tis["never"]["state"] == "failed"
    assert "timed_out" in tis["never"]["error"]


def test_a_killed_triggerers_triggers_fire_once_through_another(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    scheduler = spawn("scheduler", env=env)
    first = spawn("triggerer", "--poll", "0.2", "--lease", "2", env=env)
    second: list[subprocess.Popen[bytes]] = []
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "waits")
        wait_for(lambda: waiting(store, run_id) == WAITERS, timeout=90,
                 what="every waiter deferred", detail=lambda: str(states(store, run_id)))
        wait_for(lambda: Triggers(store).counts(time.time())["running"] >= WAITERS,
                 timeout=30, what="the first triggerer to claim every trigger")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        proc = spawn("triggerer", "--poll", "0.2", "--lease", "2", env=env)
        second.append(proc)
        third = spawn("triggerer", "--poll", "0.2", "--lease", "2", env=env)
        second.append(third)
        for i in range(WAITERS):
            (tmp_path / "files" / f"f{i}").write_text("x" * i)
        wait_for(lambda: all(states(store, run_id)[f"w{i}"] == "success"
                             for i in range(WAITERS)),
                 timeout=90, what="every waiter resumed", detail=lambda: str(states(store, run_id)))
    finally:
        store.close()
        for proc in (*second, scheduler, worker):
            stop(proc)
        stop(first)
    resumed = [line for line in ledger_lines(tmp_path) if line.startswith("resumed:")]
    assert sorted(resumed) == sorted(f"resumed:f{i}:{i}:1" for i in range(WAITERS))
