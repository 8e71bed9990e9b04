"""`dags pause|unpause`, `tasks clear`, `tasks mark` and `tasks retry` from the command line,
against a running scheduler and worker (real processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.state.store import from_url
from tests.support import conveyor, spawn, stop, wait_for


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    dags = tmp_path / "dags"
    dags.mkdir()
    ledger = tmp_path / "ledger"
    (dags / "steps.py").write_text(
        "import os\nfrom conveyor.scheduler import DAG\n"
        "dag = DAG('steps', retries=0)\n"
        f"def step(name, ok='true'): return dag.command(name, ['sh', '-c', "
        f"'echo ' + name + ' >> {ledger} && ' + ok])\n"
        "step('extract') >> step('load', os.environ.get('LOAD_OK', 'true')) >> step('report')\n"
        "other = DAG('other')\nother.command('ping', ['true'])\n")
    return {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
            "CONVEYOR_STATE_URL": f"sqlite:///{tmp_path}/state.db",
            "CONVEYOR_DAGS_FOLDER": str(dags), "LEDGER": str(ledger), "LOAD_OK": "false"}


def ran(env: dict[str, str]) -> list[str]:
    path = Path(env["LEDGER"])
    return sorted(path.read_text().split()) if path.exists() else []


def run_state(env: dict[str, str], run_id: str) -> str:
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        return str(store.one("run", run_id=run_id)["state"])
    finally:
        store.close()


def task_state(env: dict[str, str], run_id: str, task_id: str) -> str:
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        return str(store.one("run_ti_by_task", run_id=run_id, task_id=task_id)["state"])
    finally:
        store.close()


def trigger(env: dict[str, str], dag: str) -> str:
    return str(json.loads(conveyor("dags", "trigger", dag, "--json", env=env).stdout)["run_id"])


def test_pause_clear_and_mark_from_the_command_line(env: dict[str, str]) -> None:
    procs = [spawn("worker", "--queues", "default", "--log-level", "WARNING", env=env),
             spawn("scheduler", "--log-level", "WARNING", env=env)]
    try:
        paused = json.loads(conveyor("dags", "pause", "steps", "--json", env=env).stdout)
        assert paused == {"dag_id": "steps", "paused": True}
        listed = json.loads(conveyor("dags", "list", "--json", env=env).stdout)
        assert {d["dag_id"]: d["paused"] for d in listed["dags"]} == {"steps": True,
                                                                       "other": False}
        run_id = trigger(env, "steps")
        other = trigger(env, "other")        # the scheduler ticks past the paused run
        wait_for(lambda: run_state(env, other) == "success", what="the unpaused DAG's run")
        assert run_state(env, run_id) == "queued" and ran(env) == []

        conveyor("dags", "unpause", "steps", env=env)
        wait_for(lambda: run_state(env, run_id) == "failed", what="the run to fail at load")
        assert ran(env) == ["extract", "load"]

        marked = json.loads(conveyor("tasks", "mark", run_id, "load", "success", "--json",
                                     env=env).stdout)
        assert marked == {"run_id": run_id, "task_id": "load", "state": "success",
                          "was": "failed"}
        wait_for(lambda: run_state(env, run_id) == "success", what="report to run")
        assert ran(env) == ["extract", "load", "report"]

        cleared = json.loads(conveyor("tasks", "clear", run_id, "extract", "--json",
                                      env=env).stdout)
        assert cleared == {"run_id": run_id, "cleared": ["extract", "load", "report"]}
        wait_for(lambda: run_state(env, run_id) == "failed", what="the cleared run to end")
        assert ran(env) == ["extract", "extract", "load", "load", "report"]

        refused = conveyor("tasks", "clear", run_id, "nope", env=env, check=False)
        assert refused.returncode != 0 and "no task 'nope'" in refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1
    finally:
        for proc in procs:
            stop(proc)


def test_retry_runs_a_waiting_retry_now_from_the_command_line(
        env: dict[str, str], tmp_path: Path) -> None:
    marker = tmp_path / "tried"
    (Path(env["CONVEYOR_DAGS_FOLDER"]) / "flaky.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('flaky', retries=1, retry_delay=3600)\n"
        f"dag.command('once', ['sh', '-c', 'test -e {marker} || (touch {marker}; false)'])\n")
    procs = [spawn("worker", "--queues", "default", "--log-level", "WARNING", env=env),
             spawn("scheduler", "--log-level", "WARNING", env=env)]
    try:
        run_id = trigger(env, "flaky")
        wait_for(marker.exists, what="the first attempt to fail")
        wait_for(lambda: task_state(env, run_id, "once") == "up_for_retry",
                 what="the failure to reach the scheduler")
        retried = json.loads(conveyor("tasks", "retry", run_id, "once", "--json",
                                      env=env).stdout)   # not in an hour: now
        assert retried == {"run_id": run_id, "task_id": "once", "attempt": 2}
        wait_for(lambda: run_state(env, run_id) == "success", what="attempt 2 to run now")

        again = conveyor("tasks", "retry", run_id, "once", env=env, check=False)
        assert again.returncode != 0 and "it is success, not up_for_retry" in again.stderr
        assert "Traceback" not in again.stderr and len(again.stderr.splitlines()) == 1
    finally:
        for proc in procs:
            stop(proc)
