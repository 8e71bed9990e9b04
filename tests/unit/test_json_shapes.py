"""One JSON shape per entity: `runs show --json`, `tasks show --json`, `runs list --json`
and the dashboard's JSON API give a run, a task instance and an attempt the same keys and
values (all of them from `conveyor.readers.runs`); the dashboard adds only what it alone
shows (`waiting`: why a task has not run yet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import cli
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.http import Request
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


@pytest.fixture
def ui(store: Store, tmp_path: Path, state_url: str) -> Iterator[Dashboard]:
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url,
                                      dags_folder=str(tmp_path / "dags"))
    dashboard = Dashboard(UiConfig(config, "token"))
    yield dashboard
    dashboard.close()


def ran(store: Store) -> str:
    """A run of a -> b: a failed once (with output), then returned a value; b is queued."""
    dag = DAG("shapes", retries=1, retry_delay=0)
    dag.command("a", ["true"]) >> dag.command("b", ["true"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"shapes": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    engine.handle(event(executor.pop("a"), "failed", T0 + 1, log=("boom",)), T0 + 1)
    engine.tick(T0 + 2)
    second = executor.pop("a")
    engine.handle(event(second, "started", T0 + 2.5), T0 + 2.5)
    engine.handle(event(second, "succeeded", T0 + 3, result={"rows": 3}), T0 + 3)
    return run_id


def dashboard(ui: Dashboard, path: str) -> dict[str, Any]:
    response = ui.handle(Request("GET", path, headers={"host": "127.0.0.1:8700"}, body=b""))
    assert response.status == 200, response.body
    found: dict[str, Any] = json.loads(response.body)
    return found


def command(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert cli.main(list(argv)) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)
    return found


def test_the_cli_and_the_dashboard_give_a_run_its_tasks_and_attempts_one_shape(
        store: Store, ui: Dashboard, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, state_url: str) -> None:
    monkeypatch.setenv("CONVEYOR_HOME", str(tmp_path / "home"))
    run_id = ran(store)
    state = ["--state", state_url]
    shown = command(capsys, "runs", "show", run_id, "--json", *state)
    api = dashboard(ui, f"/api/runs/{run_id}")
    assert set(api) - set(shown) == {"waiting"}
    assert shown == {key: api[key] for key in shown}
    attempts = shown["attempts"]
    assert [(a["outcome"], a["result"], a["log"]) for a in attempts] == [
        ("failed", None, ["boom"]), ("succeeded", {"rows": 3}, [])]
    assert attempts[1]["took"] == 0.5 and shown["edges"] == [["a", "b"]]

    task = command(capsys, "tasks", "show", run_id, "a", "--json", *state)
    task_api = dashboard(ui, f"/api/runs/{run_id}/tasks/a")
    assert set(task_api) - set(task) == {"waiting"}
    assert task == {key: task_api[key] for key in task}
    assert task["task"] == shown["tasks"][0] and task["attempts"] == attempts
    assert task["task"]["result"] == {"rows": 3} and task["task"]["spec"]["command"] == ["true"]

    listed = command(capsys, "runs", "list", "--json", *state)["runs"]
    assert listed == dashboard(ui, "/api/runs")["runs"]
    assert {**shown["run"], "took": listed[0]["took"]} == listed[0]
