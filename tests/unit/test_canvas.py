"""The canvas: the signature algebra, the DAG a canvas becomes, and results passed through the
engine as Celery passes them (a recording executor and SQLite in tmp_path; no worker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import Signature, TaskFailed, chain, chord, group, signature, task
from conveyor.scheduler.canvas import CanvasHandle, build, create, failure, task_ids
from conveyor.scheduler.dag import UPSTREAM_REF
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.mapping import resolved
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


@task(name="tests.canvas.add", max_retries=2, queue="math")
def add(x: int, y: int) -> int:
    return x + y


@task(name="tests.canvas.tsum")
def tsum(values: list[int]) -> int:
    return sum(values)


def ref(task_id: str) -> dict[str, str]:
    return {UPSTREAM_REF: task_id}


# -- the algebra --------------------------------------------------------------------------------

def test_signatures_are_partial_calls_with_options() -> None:
    s = add.s(1)
    assert s == Signature("tests.canvas.add", (1,), {})
    assert not s.immutable and add.si(1).immutable
    assert s.clone([2], {"z": 3}) == Signature("tests.canvas.add", (1, 2), {"z": 3})
    assert s.set(queue="heavy").set(retries=5).options == {"queue": "heavy", "retries": 5}
    assert signature("other.task", [1], immutable=True) == Signature("other.task", (1,), {},
                                                                     True)
    assert repr(add.si(1, y=2)) == "tests.canvas.add.si(1, y=2)"
    with pytest.raises(TypeError, match="names a registered task"):
        Signature("")


def test_chains_flatten_and_pipes_compose() -> None:
    a, b, c = add.s(1, 1), add.s(2), add.s(3)
    assert chain(chain(a, b), c).steps == (a, b, c)
    assert (a | b | c) == chain(a, b, c) == chain([a, b, c])
    assert group(add.s(i, i) for i in range(3)).members == tuple(add.s(i, i) for i in range(3))
    assert chord([a, b], tsum.s()).header == group(a, b)
    with pytest.raises(TypeError, match="takes signatures"):
        chain(a, 3)
    with pytest.raises(TypeError, match="at least one step"):
        chain()
    with pytest.raises(TypeError, match="chord's body"):
        chord([a], "tsum")  # type: ignore[arg-type]


# -- the DAG a canvas becomes -------------------------------------------------------------------

def specs(canvas: Any, name: str = "") -> tuple[str, dict[str, dict[str, Any]], Any]:
    dag, shape = build(canvas, name)
    dag.validate(["queue"])
    return dag.dag_id, {tid: node.spec() for tid, node in dag.tasks.items()}, shape


def test_a_chain_prepends_the_previous_result_unless_immutable() -> None:
    dag_id, tasks, shape = specs(chain(add.s(1, 2), add.s(10), add.si(5, 5), add.s(100)))
    assert dag_id == "canvas.add" and shape == "add-3"
    assert tasks["add-0"]["args"] == [1, 2] and tasks["add-0"]["upstream"] == []
    assert tasks["add-1"]["args"] == [ref("add-0"), 10]
    assert tasks["add-2"]["args"] == [5, 5] and tasks["add-2"]["upstream"] == ["add-1"]
    assert tasks["add-3"]["args"] == [ref("add-2"), 100]


def test_a_chord_gives_its_callback_the_list_of_results_in_order() -> None:
    dag_id, tasks, shape = specs(chord(group(add.s(i, i) for i in range(3)), tsum.s()), "sums")
    assert dag_id == "canvas.sums" and shape == "tsum-3"
    assert tasks["tsum-3"]["args"] == [[ref("add-0"), ref("add-1"), ref("add-2")]]
    assert tasks["tsum-3"]["upstream"] == ["add-0", "add-1", "add-2"]
    # a chain holding a group then a task means the same (Celery upgrades it to a chord)
    assert specs(chain(group(add.s(i, i) for i in range(3)), tsum.s()), "sums")[1] == tasks


def test_a_group_of_chains_after_a_task_feeds_each_chain_and_returns_their_ends() -> None:
    canvas = chain(add.s(1, 1), group(chain(add.s(1), add.s(2)), add.s(3)))
    _, tasks, shape = specs(canvas)
    assert shape == ["add-2", "add-3"] and task_ids(shape) == ["add-2", "add-3"]
    assert tasks["add-1"]["args"] == [ref("add-0"), 1]
    assert tasks["add-2"]["args"] == [ref("add-1"), 2]
    assert tasks["add-3"]["args"] == [ref("add-0"), 3]


def test_options_layer_over_the_registered_task() -> None:
    dag, _ = build(chain(add.s(1, 1), add.s(2).set(queue="heavy", retries=0)))
    assert dag.tasks["add-0"].options.queue == "math"
    assert dag.tasks["add-0"].options.retries == 2
    assert dag.tasks["add-1"].options.queue == "heavy"
    assert dag.tasks["add-1"].options.retries == 0


def test_a_canvas_without_tasks_and_bad_options_are_refused() -> None:
    with pytest.raises(TypeError, match="no task to run"):
        build(group())
    with pytest.raises(Exception, match="unknown task option"):
        build(add.s(1, 1).set(colour="red"))


def test_resolved_fills_references_inside_lists() -> None:
    assert resolved([ref("a"), [ref("b"), 3]], {"a": 1, "b": 2}) == [1, [2, 3]]


# -- through the engine -------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = from_url(f"sqlite:///{tmp_path}/state.db")
    yield opened
    opened.close()


def succeed(engine: Engine, executor: RecordingExecutor, task_id: str, result: Any,
            at: float) -> list[Any]:
    work = executor.pop(task_id)
    engine.handle(event(work, "succeeded", at, result=result), at)
    return list(work.message.args)


def test_a_chord_runs_and_its_handle_returns_the_callbacks_result(store: Store,
                                                                  tmp_path: Path) -> None:
    dag, shape = build(chord(group(add.s(i, i) for i in range(3)), tsum.s()))
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor})
    run_id = create(store, dag, T0, ["queue"])
    assert store.one("run", run_id=run_id)["run_type"] == "canvas"
    engine.tick(T0)
    assert sorted(executor.task_ids()) == ["add-0", "add-1", "add-2"]
    for i in (2, 0, 1):   # out of order: the list keeps the group's order
        assert succeed(engine, executor, f"add-{i}", 2 * i, T0 + 1 + i) == [i, i]
    assert succeed(engine, executor, "tsum-3", 6, T0 + 5) == [[0, 2, 4]]
    handle = CanvasHandle(run_id, dag.dag_id, shape, f"sqlite:///{tmp_path}/state.db")
    assert handle.status() == "success" and handle.result(timeout=0) == 6
    group_handle = CanvasHandle(run_id, dag.dag_id, ["add-0", "add-2"], handle.state_url)
    assert group_handle.result(timeout=0) == [0, 4]


def test_a_failed_chain_stops_and_its_handle_raises_the_tasks_error(store: Store,
                                                                    tmp_path: Path) -> None:
    dag, shape = build(chain(add.s(1, 1).set(retries=0), add.s(2), add.s(3)))
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor})
    run_id = create(store, dag, T0, ["queue"])
    handle = CanvasHandle(run_id, dag.dag_id, shape, f"sqlite:///{tmp_path}/state.db")
    with pytest.raises(Exception, match="has not ended after 0 s"):
        handle.result(timeout=0)
    engine.tick(T0)
    work = executor.pop("add-0")
    engine.handle(event(work, "failed", T0 + 1, error={
        "type": "ValueError", "message": "boom", "traceback": "Traceback ...\nValueError"}),
        T0 + 1)
    assert executor.task_ids() == []
    with pytest.raises(TaskFailed, match="task add-0 failed for good: failed: ValueError: "
                                         "boom") as caught:
        handle.result(timeout=0)
    assert (caught.value.error_type, caught.value.error_message) == ("ValueError", "boom")
    assert caught.value.remote_traceback.startswith("Traceback")
    states = {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=run_id)}
    assert states == {"add-0": "failed", "add-1": "upstream_failed",
                      "add-2": "upstream_failed"}


def test_a_failed_step_is_retried_as_a_dag_task_and_the_chain_goes_on(store: Store,
                                                                        tmp_path: Path) -> None:
    """add's @task gives it max_retries=2: its first failure is retried after its backoff,
    and the next step gets the retried attempt's result."""
    dag, shape = build(chain(add.s(1, 1), add.s(2)))
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor})
    run_id = create(store, dag, T0, ["queue"])
    engine.tick(T0)
    engine.handle(event(executor.pop("add-0"), "failed", T0 + 1,
                        error={"type": "OSError", "message": "flaky"}), T0 + 1)
    assert executor.task_ids() == []
    engine.tick(T0 + 3600)                          # past the task's backoff
    retry = executor.pop("add-0")
    assert retry.message.attempt == 2
    engine.handle(event(retry, "succeeded", T0 + 3601, result=2), T0 + 3601)
    assert succeed(engine, executor, "add-1", 4, T0 + 3602) == [2, 2]
    handle = CanvasHandle(run_id, dag.dag_id, shape, f"sqlite:///{tmp_path}/state.db")
    assert handle.result(timeout=0) == 4


def test_two_canvases_of_one_name_at_the_same_instant_get_two_runs(store: Store) -> None:
    dag, _ = build(add.s(1, 1))
    assert create(store, dag, T0, ["queue"]) != create(store, dag, T0, ["queue"])


def test_failure_reads_the_engines_error_text() -> None:
    error = failure("r", "canvas.x", "t", "timed_out (time limit 1 s)")
    assert error.reason == "timed_out (time limit 1 s)" and error.error_type == ""


def test_the_dashboard_lists_a_canvas_run_and_draws_its_tasks(store: Store,
                                                              tmp_path: Path) -> None:
    from conveyor.scheduler.config import SchedulerConfig
    from conveyor.ui.app import Dashboard, UiConfig
    from conveyor.ui.http import Request

    dag, _ = build(chord(group(add.s(i, i) for i in range(2)), tsum.s()), "sums")
    run_id = create(store, dag, T0, ["queue"])
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=f"sqlite:///{tmp_path}/state.db",
                                      dags_folder=str(tmp_path / "dags"))
    dashboard = Dashboard(UiConfig(config, ""))
    try:
        pages = [dashboard.handle(Request("GET", path, headers={"host": "127.0.0.1:8700"}))
                 for path in ("/runs", f"/runs/{run_id}")]
    finally:
        dashboard.close()
    assert [page.status for page in pages] == [200, 200]
    listed, shown = (page.body.decode() for page in pages)
    assert "canvas.sums" in listed and run_id in listed and "canvas" in shown
    assert all(task in shown for task in ("add-0", "add-1", "tsum-2"))
