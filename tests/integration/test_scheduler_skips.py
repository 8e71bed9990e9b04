"""Tasks that skip themselves, end to end: a real `conveyor scheduler` and `conveyor worker`
on SQLite and on Postgres run a DAG whose Python task raises `Skip` and whose command task
exits 99 (`skip_on_exit_code`'s default): each ends skipped, on its first attempt though it
has retries, and the tasks below follow their trigger rules (all_success skipped,
none_failed run, one_failed skipped); the run succeeds. A ledger counts every task's runs.
And a scheduler SIGKILLed at the skip step (the skip, the skips below it and the claim of
the none_failed task it made ready committed, not published) loses and repeats nothing once
another scheduler takes over."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.store import from_url
from tests.integration.dagstack import dag_stack, ledger_lines, trigger_run
from tests.support import spawn, stop, wait_for

ROOT = Path(__file__).parents[2]

DAG_FILE = '''\
from conveyor import DAG, Skip, task

LEDGER = {ledger!r}


def note(name):
    with open(LEDGER, "a") as out:
        out.write(name + "\\n")


@task(name="skiptest.check")
def check():
    note("check")
    raise Skip("no new files today")


def step(name, code=0):
    return ["sh", "-c", f"echo {{name}} >> {{LEDGER}}; exit {{code}}"]


dag = DAG("skiptest", retries=2, retry_delay=0.1)
checked = dag.task(check)
load = dag.command("load", step("load"))
publish = dag.command("publish", step("publish"), trigger_rule="none_failed")
alert = dag.command("alert", step("alert"), trigger_rule="one_failed")
checked >> [load, publish, alert]
load >> dag.command("after_load", step("after_load"))
optional = dag.command("optional", step("optional", code=99))
optional >> dag.command("after_optional", step("after_optional"))
optional >> dag.command("cleanup", step("cleanup"), trigger_rule="all_done")
'''

EXPECTED = {"check": ("skipped", 1), "load": ("skipped", 0), "publish": ("success", 1),
            "alert": ("skipped", 0), "after_load": ("skipped", 0),
            "optional": ("skipped", 1), "after_optional": ("skipped", 0),
            "cleanup": ("success", 1)}
RAN_ONCE = ["check", "cleanup", "optional", "publish"]


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A DAG folder, a ledger, and a broker on the same database as the state store."""
    with dag_stack(state_url, unique, tmp_path, "skiptest.py",
                   DAG_FILE.format(ledger=str(tmp_path / "ledger"))) as made:
        yield made


def test_a_task_raising_skip_and_a_command_exiting_99_skip_and_their_children_follow_rules(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    scheduler = spawn("scheduler", env=env)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "skiptest")
        wait_for(lambda: store.one("run", run_id=run_id)["state"] in ("success", "failed"),
                 timeout=60, what="the run to end")
        tasks = {r["task_id"]: (r["state"], r["attempt"])
                 for r in store.rows("run_tis", run_id=run_id)}
        errors = {r["task_id"]: r["error"] for r in store.rows("run_tis", run_id=run_id)}
        run = store.one("run", run_id=run_id)
    finally:
        store.close()
        for proc in (scheduler, worker):
            stop(proc)
    assert tasks == EXPECTED
    assert "no new files today" in errors["check"]
    assert "exited with code 99 (skip_on_exit_code)" in errors["optional"]
    assert run["state"] == "success"
    assert ledger_lines(tmp_path) == RAN_ONCE


def test_scheduler_killed_at_the_skip_step_loses_and_repeats_nothing(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_PUBLISHING": "publish"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survivor: subprocess.Popen[bytes] | None = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "skiptest")
        assert crashing.wait(60) == -9, "the scheduler should have died at the skip step"
        found = {r["task_id"]: r for r in store.rows("run_tis", run_id=run_id)}
        committed = {"check": "skipped", "load": "skipped", "alert": "skipped",
                     "after_load": "skipped", "publish": "queued"}
        assert {t: found[t]["state"] for t in committed} == committed
        assert found["publish"]["published_at"] is None
        survivor = spawn("scheduler", "--burst", env=env)
        assert survivor.wait(90) == 0
        tasks = {r["task_id"]: (r["state"], r["attempt"])
                 for r in store.rows("run_tis", run_id=run_id)}
        run = store.one("run", run_id=run_id)
    finally:
        store.close()
        for proc in (crashing, survivor, worker):
            if proc is not None:
                stop(proc)
    assert tasks == EXPECTED
    assert run["state"] == "success"
    assert ledger_lines(tmp_path) == RAN_ONCE
