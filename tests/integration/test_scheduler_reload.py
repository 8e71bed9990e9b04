"""Hot reload against a running `conveyor scheduler`: an edited DAG file (a new task, a new
schedule) is picked up without a restart; a run in flight keeps the version it started with
while new runs use the new one; a file that starts failing keeps its last good version with
the error shown; a deleted file stops being scheduled while its runs in flight finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.state import store as stores
from tests.support import conveyor, stop, wait_for

FLOW = '''
from conveyor.scheduler import DAG

dag = DAG("flow"{schedule})
a = dag.command("a", ["sh", "-c", "while [ ! -e {gate} ]; do sleep 0.05; done"])
b = dag.command("b", ["true"])
a >> b
{more}
'''
EVERY_SECOND = ', schedule="* * * * * *", catchup=False'
GONE = '''
from conveyor.scheduler import DAG

dag = DAG("gone", schedule="* * * * * *", catchup=False)
dag.command("t", ["true"])
'''


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    dags = tmp_path / "dags"
    dags.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(CONVEYOR_BROKER_URL=f"sqlite:///{tmp_path}/broker.db",
               CONVEYOR_STATE_URL=f"sqlite:///{tmp_path}/state.db",
               CONVEYOR_DAGS_FOLDER=str(dags), CONVEYOR_EXECUTORS="local",
               CONVEYOR_DAGS_RELOAD_INTERVAL="0.2", CONVEYOR_LOCAL_SLOTS="8")
    return {"dags": dags, "env": env, "gate": tmp_path / "gate", "log": tmp_path / "sched.log"}


@pytest.fixture
def scheduler(setup: dict[str, Any]) -> Iterator[subprocess.Popen[bytes]]:
    with open(setup["log"], "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "scheduler"],
                                env=setup["env"], stdout=log, stderr=log)
    yield proc
    stop(proc)


def runs(setup: dict[str, Any], dag_id: str) -> list[dict[str, Any]]:
    """Every run of `dag_id`, oldest first, with its task ids."""
    store = stores.from_url(setup["env"]["CONVEYOR_STATE_URL"])
    try:
        found = store.rows("recent_runs", dag_id=dag_id, state="", limit=1000)
        for run in found:
            run["tasks"] = sorted(t["task_id"] for t in store.rows("run_tis",
                                                                     run_id=run["run_id"]))
        return sorted(found, key=lambda r: r["created_at"])
    finally:
        store.close()


def logged(setup: dict[str, Any], text: str) -> bool:
    return text in setup["log"].read_text()


def test_a_running_scheduler_follows_its_dag_files(
        setup: dict[str, Any], scheduler: subprocess.Popen[bytes]) -> None:
    dags, gate = setup["dags"], setup["gate"]
    flow = dags / "flow.py"
    flow.write_text(FLOW.format(schedule="", gate=gate, more=""))
    (dags / "gone.py").write_text(GONE)
    tail = lambda: setup["log"].read_text()[-3000:]  # noqa: E731
    wait_for(lambda: logged(setup, "scheduler starting"), what="the scheduler", detail=tail)

    # a run in flight when its DAG changes
    conveyor("dags", "trigger", "flow", env=setup["env"])
    wait_for(lambda: [r for r in runs(setup, "flow") if r["state"] == "running"],
             what="the first run of flow running", detail=tail)
    [first] = runs(setup, "flow")

    # a deleted file stops scheduling
    wait_for(lambda: runs(setup, "gone"), what="a run of gone", detail=tail)
    (dags / "gone.py").unlink()
    wait_for(lambda: logged(setup, "DAG gone (gone.py): removed"), detail=tail)
    created = len(runs(setup, "gone"))

    # a new task and a schedule
    flow.write_text(FLOW.format(schedule=EVERY_SECOND, gate=gate,
                                more='c = dag.command("c", ["true"])\nb >> c'))
    wait_for(lambda: logged(setup, f"DAG flow (flow.py): version {first['dag_version']} -> "),
             detail=tail)
    scheduled = wait_for(lambda: [r for r in runs(setup, "flow")
                                  if r["run_type"] == "scheduled"], what="a scheduled run",
                         detail=tail)
    new_version = scheduled[0]["dag_version"]
    assert new_version != first["dag_version"] and scheduled[0]["tasks"] == ["a", "b", "c"]

    # a file that starts failing: the last good version stays scheduled, the error is shown
    flow.write_text("from conveyor.scheduler import DAG\n\nraise RuntimeError('half-saved')\n")
    wait_for(lambda: logged(setup, "DAG flow (flow.py:3): the file no longer loads; version "
                                   f"{new_version} stays scheduled"), detail=tail)
    assert "RuntimeError: half-saved" in tail()
    before = len(runs(setup, "flow"))
    wait_for(lambda: len(runs(setup, "flow")) > before + 1, what="runs after the failure",
             detail=tail)
    assert {r["dag_version"] for r in runs(setup, "flow")[before:]} == {new_version}
    listed = conveyor("dags", "list", "--json", env=setup["env"], check=False)
    assert listed.returncode == 1
    [error] = json.loads(listed.stdout)["errors"]
    assert error["file"] == str(flow) and error["line"] == 3

    # removed while its runs are in flight: no new runs, and those in flight finish
    flow.unlink()
    wait_for(lambda: logged(setup, "DAG flow (flow.py): removed"), detail=tail)
    gate.touch()
    wait_for(lambda: all(r["state"] == "success" for r in runs(setup, "flow")), timeout=60,
             what="every run of flow to succeed", detail=tail)
    done = {r["run_id"]: r for r in runs(setup, "flow")}
    assert done[first["run_id"]]["tasks"] == ["a", "b"]
    assert done[first["run_id"]]["dag_version"] == first["dag_version"]
    assert all(r["tasks"] == ["a", "b", "c"] for r in done.values() if r["run_type"] ==
               "scheduled")
    flow_runs = len(done)
    time.sleep(1.5)
    assert len(runs(setup, "gone")) == created      # no run since the file went
    assert len(runs(setup, "flow")) == flow_runs
    assert scheduler.poll() is None


PIPE = '''
from conveyor.scheduler import DAG
from mods_a import first
{more_import}

dag = DAG("pipe")
a = dag.task(first)
{more}
'''


def test_the_local_executor_restarts_its_worker_for_a_new_task_module(
        tmp_path: Path, setup: dict[str, Any]) -> None:
    """The local executor's worker imports the task modules the DAGs needed at start; a DAG
    file that brings a new one gets a new worker (the old one drains) before its tasks run."""
    for name, fn in (("mods_a", "first"), ("mods_b", "second")):
        (tmp_path / f"{name}.py").write_text(
            f"from conveyor import task\n\n\n@task\ndef {fn}(*_: object) -> str:\n"
            f"    return {fn!r}\n")
    pipe = setup["dags"] / "pipe.py"
    pipe.write_text(PIPE.format(more_import="", more=""))
    tail = lambda: setup["log"].read_text()[-3000:]  # noqa: E731
    with open(setup["log"], "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "scheduler"],
                                env=setup["env"], cwd=tmp_path, stdout=log, stderr=log)
    try:
        wait_for(lambda: logged(setup, "scheduler starting"), what="the scheduler", detail=tail)

        def run_pipe() -> dict[str, str]:
            done = subprocess.run([sys.executable, "-m", "conveyor.cli", "dags", "trigger",
                                   "pipe", "--wait", "--timeout=60", "--json"],
                                  env=setup["env"], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=90)
            assert done.returncode == 0, done.stdout + done.stderr + tail()
            return {t["task_id"]: t["state"] for t in json.loads(done.stdout)["tasks"]}

        assert run_pipe() == {"first": "success"}
        pipe.write_text(PIPE.format(more_import="from mods_b import second",
                                    more="a >> dag.task(second)"))
        wait_for(lambda: logged(setup, "local executor: task modules now mods_a,mods_b"),
                 detail=tail)
        assert run_pipe() == {"first": "success", "second": "success"}
    finally:
        stop(proc)
