"""Trigger rules and branches end to end: a real `conveyor scheduler` and `conveyor worker` on
SQLite and on Postgres run a DAG with a branch, a join after it
(none_failed_min_one_success), a failing task with an all_done cleanup and a one_failed
alert; and a scheduler SIGKILLed at the branch step (after the branch's success, the skip
and the claim of the chosen task committed, before publishing it), or at the failure step
(the failure, upstream_failed below it and the claims of cleanup and alert committed),
loses nothing and runs nothing twice once another scheduler takes over. A ledger counts
every task's runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.store import from_url
from tests.integration.dagstack import dag_stack, ledger_lines, trigger_run
from tests.support import conveyor, spawn, stop, wait_for

ROOT = Path(__file__).parents[2]

DAG_FILE = '''\
from conveyor import DAG, task

LEDGER = {ledger!r}


def note(name):
    with open(LEDGER, "a") as out:
        out.write(name + "\\n")


@task(name="flowtest.choose")
def choose():
    note("choose")
    return "incremental"


def step(name, fails=False):
    return ["sh", "-c", f"echo {{name}} >> {{LEDGER}}" + ("; exit 1" if fails else "")]


dag = DAG("flowtest", retries=0)
pick = dag.branch(choose)
full = dag.command("full", step("full"))
incremental = dag.command("incremental", step("incremental"))
join = dag.command("join", step("join"), trigger_rule="none_failed_min_one_success")
pick >> [full, incremental] >> join
flaky = dag.command("flaky", step("flaky", fails=True))
after = dag.command("after_flaky", step("after_flaky"))
cleanup = dag.command("cleanup", step("cleanup"), trigger_rule="all_done")
alert = dag.command("alert", step("alert"), trigger_rule="one_failed")
flaky >> [after, cleanup, alert]
'''

EXPECTED = {"choose": "success", "full": "skipped", "incremental": "success",
            "join": "success", "flaky": "failed", "after_flaky": "upstream_failed",
            "cleanup": "success", "alert": "success"}
RAN_ONCE = ["alert", "choose", "cleanup", "flaky", "incremental", "join"]


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A DAG folder, a ledger, and a broker on the same database as the state store."""
    with dag_stack(state_url, unique, tmp_path, "flowtest.py",
                   DAG_FILE.format(ledger=str(tmp_path / "ledger"))) as made:
        yield made


def test_branch_join_cleanup_and_alert_with_a_real_scheduler_and_worker(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    scheduler = spawn("scheduler", env=env)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "flowtest")
        wait_for(lambda: store.one("run", run_id=run_id)["state"] in ("success", "failed"),
                 timeout=60, what="the run to end")
        tasks = {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=run_id)}
        run = store.one("run", run_id=run_id)
        shown = conveyor("runs", "show", run_id, env=env).stdout
    finally:
        store.close()
        for proc in (scheduler, worker):
            stop(proc)
    assert tasks == EXPECTED
    assert run["state"] == "failed"          # flaky failed, whatever ran after it
    assert ledger_lines(tmp_path) == RAN_ONCE
    assert "skipped" in shown and "upstream_failed" in shown


#: Where the scheduler dies: (tasks whose publish kills it, what the store holds then).
KILLED_AT = {
    # the branch's success, the skip and the claim of its choice committed together
    "branch": ("incremental", {"choose": "success", "full": "skipped",
                               "incremental": "queued"}),
    # the failure, the upstream_failed below it and the claims of cleanup and alert
    "failure": ("cleanup,alert", {"flaky": "failed", "after_flaky": "upstream_failed",
                                  "cleanup": "queued", "alert": "queued"}),
}


@pytest.mark.parametrize("step", sorted(KILLED_AT))
def test_scheduler_killed_at_a_rules_step_loses_and_repeats_nothing(
        env: dict[str, str], tmp_path: Path, step: str) -> None:
    die_at, committed = KILLED_AT[step]
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_PUBLISHING": die_at},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survivor: subprocess.Popen[bytes] | None = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "flowtest")
        assert crashing.wait(60) == -9, f"the scheduler should have died at the {step} step"
        found = {r["task_id"]: r for r in store.rows("run_tis", run_id=run_id)}
        assert {t: found[t]["state"] for t in committed} == committed
        assert all(found[t]["published_at"] is None for t in die_at.split(","))
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
    assert {task: state for task, (state, _) in tasks.items()} == EXPECTED
    assert all(tasks[t] == ("success", 1) for t in die_at.split(","))
    assert run["state"] == "failed"
    assert ledger_lines(tmp_path) == RAN_ONCE
