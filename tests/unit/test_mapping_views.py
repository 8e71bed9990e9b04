"""Mapped instances as people see them: `runs show` (text and JSON), `tasks clear|mark
--index`, and the dashboard's run page, grid and mapped task page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import cli
from conveyor.cli.runs import show_run
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url
from conveyor.state.tasks import TaskInstances
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.http import Request
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


@pytest.fixture
def state_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


@pytest.fixture
def mapped_run(state_url: str) -> Iterator[tuple[Store, str]]:
    """A run whose mapped task `process` has 3 instances: two succeeded, one runs."""
    dag = DAG("views")
    extract = dag.task("p.extract", id="extract")
    process = dag.task("p.process").expand(item=extract)
    dag.task("p.reduce", id="reduce", args=[process])
    store = from_url(state_url)
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"views": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    for task_id, result in (("extract", ["a", "b", "c"]), ("process[0]", "A"),
                            ("process[2]", "C")):
        engine.handle(event(executor.pop(task_id), "succeeded", T0 + 1, result=result), T0 + 1)
    yield store, run_id
    store.close()


def test_runs_show_lists_instances_by_index_under_their_mapped_task(
        mapped_run: tuple[Store, str], capsys: pytest.CaptureFixture[str]) -> None:
    store, run_id = mapped_run
    show_run(store, run_id, as_json=False)
    text = capsys.readouterr().out
    assert "running (3 mapped: 1 queued, 2 success)" in text
    assert text.index("  process[0]") < text.index("  process[2]") < text.index("reduce")
    show_run(store, run_id, as_json=True)
    tasks = {t["task_id"]: t for t in json.loads(capsys.readouterr().out)["tasks"]}
    assert (tasks["process[2]"]["map_index"], tasks["process[2]"]["map_task"],
            tasks["process[2]"]["result"], tasks["process"]["map_count"]) == (
        2, "process", "C", 3)


def test_tasks_clear_and_mark_take_an_index(mapped_run: tuple[Store, str], state_url: str,
                                            tmp_path: Path) -> None:
    store, run_id = mapped_run
    flags = [f"--state={state_url}", f"--broker=sqlite:///{tmp_path}/broker.db"]
    assert cli.main(["tasks", "mark", run_id, "process", "failed", "--index", "1",
                     *flags]) == 0
    assert cli.main(["tasks", "clear", run_id, "process", "--index", "0", *flags]) == 0
    tis = {ti.task_id: ti.state for ti in TaskInstances(store).of_run(run_id)}
    assert (tis["process[0]"], tis["process[1]"], tis["process[2]"]) == (
        "pending", "failed", "success")
    assert cli.main(["tasks", "clear", run_id, "process", "--index", "7", *flags]) == 2


def test_tasks_show_takes_an_index(mapped_run: tuple[Store, str], state_url: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, run_id = mapped_run
    assert cli.main(["tasks", "show", run_id, "process", "--index", "2", "--json",
                     f"--state={state_url}"]) == 0
    task = json.loads(capsys.readouterr().out)["task"]
    assert (task["task_id"], task["map_index"], task["result"]) == ("process[2]", 2, "C")
    assert cli.main(["tasks", "show", run_id, "process", "--json",
                     f"--state={state_url}"]) == 0   # the mapped task: its instances too
    doc = json.loads(capsys.readouterr().out)
    assert [(i["map_index"], i["state"]) for i in doc["instances"]] == [
        (0, "success"), (1, "queued"), (2, "success")]


def test_the_dashboard_shows_a_mapped_task_as_one_cell_and_its_instances_on_its_page(
        mapped_run: tuple[Store, str], state_url: str, tmp_path: Path) -> None:
    store, run_id = mapped_run
    ui = Dashboard(UiConfig(SchedulerConfig.from_env(
        {}, broker_url=f"sqlite:///{tmp_path}/broker.db", state_url=state_url), "", ()))
    try:
        run_page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
        task_page = ui.handle(Request("GET", f"/runs/{run_id}/tasks/process")).body.decode()
        polled = json.loads(ui.handle(Request("GET", f"/api/runs/{run_id}/tasks/process")
                                      ).body)   # changes as the instances do: the page too
        instance = ui.handle(Request("GET", f"/runs/{run_id}/tasks/process%5B2%5D")
                             ).body.decode()
    finally:
        ui.close()
    assert "3 mapped: 1 queued, 2 success" in run_page
    assert 'title="3 mapped">3</a>' in run_page              # the grid's cell
    assert ">process[1]<" not in run_page                    # instances: on the task page
    assert "Mapped instances (3 mapped: 1 queued, 2 success)" in task_page
    assert f'href="/runs/{run_id}/tasks/process%5B1%5D">1</a>' in task_page
    assert f'<a href="/runs/{run_id}/tasks/process">process</a>' in instance
    assert [i["state"] for i in polled["instances"]] == ["success", "queued", "success"]
