"""Dynamic task mapping: the expansion rules, and the engine creating, running and closing
mapped instances on a real SQLite state store (executor recorded, events made by hand);
tests/contract/test_mapping_state.py runs the engine tests on Postgres too."""

from __future__ import annotations

import pytest

from conveyor.context import TaskContext
from conveyor.errors import ConfigError
from conveyor.scheduler import DAG
from conveyor.scheduler.cancel import cancel_task
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.dag import UPSTREAM_REF
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.errors import DagError
from conveyor.scheduler.mapping import MapError, instance_kwargs
from conveyor.scheduler.operations import clear, mark
from conveyor.scheduler.runs import create_run
from conveyor.state.runs import Runs
from conveyor.state.store import Store
from conveyor.state.tasks import TaskInstances
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0
REF = {UPSTREAM_REF: "extract"}


# -- the rules ------------------------------------------------------------------------------

def test_one_instance_per_element_of_an_upstream_list() -> None:
    got = instance_kwargs({"kwargs": {"item": REF}}, {"extract": [3, 1, 2]}, 10)
    assert got == [{"item": 3}, {"item": 1}, {"item": 2}]


def test_a_literal_list_maps_without_an_upstream() -> None:
    assert instance_kwargs({"kwargs": {"n": [1, 2]}}, {}, 10) == [{"n": 1}, {"n": 2}]


def test_several_lists_map_over_their_cross_product_first_slowest() -> None:
    got = instance_kwargs({"kwargs": {"a": [1, 2], "b": ["x", "y", "z"]}}, {}, 10)
    assert got == [{"a": a, "b": b} for a in (1, 2) for b in "xyz"]


def test_zip_pairs_elements_and_refuses_lists_of_different_lengths() -> None:
    got = instance_kwargs({"kwargs": {"a": [1, 2], "b": REF}, "zip": True},
                          {"extract": ["x", "y"]}, 10)
    assert got == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    with pytest.raises(MapError, match="one length, got a: 2, b: 3"):
        instance_kwargs({"kwargs": {"a": [1, 2], "b": [1, 2, 3]}, "zip": True}, {}, 10)


def test_an_empty_list_maps_to_nothing() -> None:
    assert instance_kwargs({"kwargs": {"item": REF}}, {"extract": []}, 10) == []
    assert instance_kwargs({"kwargs": {"a": [1], "b": []}}, {}, 10) == []


def test_a_list_longer_than_the_limit_is_refused_before_it_is_built() -> None:
    with pytest.raises(MapError, match="create 4 instances, more than max_map_length 3"):
        instance_kwargs({"kwargs": {"item": REF}}, {"extract": [1, 2, 3, 4]}, 3)
    with pytest.raises(MapError, match="1000000 instances"):   # the product, never listed
        instance_kwargs({"kwargs": {"a": list(range(1000)), "b": list(range(1000))}}, {}, 10)


def test_an_upstream_that_did_not_succeed_has_nothing_to_map_over() -> None:
    """A mapped task whose trigger rule lets it run after its upstream failed (all_done)."""
    with pytest.raises(MapError, match="task 'extract' did not succeed"):
        instance_kwargs({"kwargs": {"item": REF}}, {}, 10)


def test_what_is_not_a_list_is_refused_naming_the_task_that_returned_it() -> None:
    with pytest.raises(MapError, match="over dict .*task 'extract' returned that, not a list"):
        instance_kwargs({"kwargs": {"item": REF}}, {"extract": {"a": 1}}, 10)


# -- declaring ------------------------------------------------------------------------------

def test_expand_records_the_map_in_the_spec_and_the_upstream_edge() -> None:
    dag = DAG("m")
    extract = dag.task("p.extract", id="extract")
    process = dag.task("p.process", kwargs={"scale": 2}, max_map_length=5).expand(
        item=extract)
    assert ("extract", "process") in dag.edges()
    assert process.spec()["expand"] == {"kwargs": {"item": REF}, "zip": False,
                                        "max_length": 5}
    assert "expand" not in extract.spec()


@pytest.mark.parametrize(("build", "message"), [
    (lambda d: d.command("c", ["true"]).expand(x=[1]), "a command task takes no arguments"),
    (lambda d: d.task("p.t").expand(x=[1]).expand(y=[2]), "mapped already"),
    (lambda d: d.task("p.t").expand(), "give keyword=list or task"),
    (lambda d: d.task("p.t", kwargs={"x": 1}).expand(x=[1]), "also one of its fixed"),
    (lambda d: d.task("p.t").expand(x=3), "give a list, or a task"),
    (lambda d: d.task("p.t", max_map_length=-1), "max_map_length"),
])
def test_a_map_that_cannot_work_fails_at_its_line(build, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DagError, match=message):
        build(DAG("bad"))


# -- the engine -----------------------------------------------------------------------------

def mapped_dag(**options: object) -> DAG:
    dag = DAG("mapped")
    extract = dag.task("p.extract", id="extract")
    process = dag.task("p.process", kwargs={"scale": 10}, retries=1, retry_delay=0,
                       **options).expand(item=extract)
    dag.task("p.reduce", id="reduce", args=[process])
    dag.validate(["queue"])
    return dag


def started(store: Store, dag: DAG) -> tuple[Engine, RecordingExecutor, str]:
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    return engine, executor, run_id


def succeed(engine: Engine, executor: RecordingExecutor, task_id: str, result: object,
            at: float = T0 + 1) -> None:
    engine.handle(event(executor.pop(task_id), "succeeded", at, result=result), at)


def states(store: Store, run_id: str) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in TaskInstances(store).of_run(run_id)}


def test_instances_run_with_their_element_and_reduce_gets_results_in_order(
        store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", ["a", "b", "c"])
    sent = {w.message.headers["task_id"]: w.message for w in executor.sent}
    assert sorted(sent) == ["process[0]", "process[1]", "process[2]"]
    assert sent["process[1]"].kwargs == {"scale": 10, "item": "b"}
    assert sent["process[1]"].headers["map_index"] == "1"
    assert states(store, run_id)["process"] == "running"
    # one fails once and is retried on its own; they end out of order
    engine.handle(event(executor.pop("process[1]"), "failed", T0 + 2), T0 + 2)
    engine.tick(T0 + 3)
    succeed(engine, executor, "process[2]", "C", T0 + 4)
    succeed(engine, executor, "process[1]", "B", T0 + 5)
    assert "reduce" not in executor.task_ids()
    succeed(engine, executor, "process[0]", "A", T0 + 6)
    assert executor.pop("reduce").message.args == (["A", "B", "C"],)
    tis = {ti.task_id: ti for ti in TaskInstances(store).of_run(run_id)}
    assert [t for t in tis] == ["extract", "process", "process[0]", "process[1]",
                                "process[2]", "reduce"]
    assert tis["process[1]"].attempt == 2 and tis["process"].map_count == 3


def test_a_failed_instance_fails_the_mapped_task_once_all_ended(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", [1, 2])
    for attempt_at in (T0 + 2, T0 + 4):
        engine.handle(event(executor.pop("process[0]"), "failed", attempt_at), attempt_at)
        engine.tick(attempt_at + 1)
    assert states(store, run_id)["process"] == "running"     # process[1] still runs
    succeed(engine, executor, "process[1]", 2, T0 + 6)
    found = states(store, run_id)
    assert (found["process"], found["reduce"]) == ("failed", "upstream_failed")
    assert "index 0 (failed)" in (TaskInstances(store).by_task(run_id, "process").error or "")
    run = Runs(store).get(run_id)
    assert run is not None and run.state == "failed"


def test_an_empty_list_skips_the_mapped_task_and_what_is_below(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", [])
    assert executor.sent == []
    assert states(store, run_id) == {"extract": "success", "process": "skipped",
                                     "reduce": "skipped"}
    run = Runs(store).get(run_id)
    assert run is not None and run.state == "success"


def test_a_list_over_max_map_length_fails_the_mapped_task_saying_why(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag(max_map_length=2))
    succeed(engine, executor, "extract", [1, 2, 3])
    assert executor.sent == []
    process = TaskInstances(store).by_task(run_id, "process")
    assert process is not None and process.state == "failed"
    assert "3 instances, more than max_map_length 2" in (process.error or "")
    assert states(store, run_id)["reduce"] == "upstream_failed"


def test_the_scheduler_setting_is_the_default_limit(store: Store) -> None:
    dag = mapped_dag()
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={dag.dag_id: dag}, max_map_length=1)
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    succeed(engine, executor, "extract", [1, 2])
    assert states(store, run_id)["process"] == "failed"


def test_a_root_maps_over_a_literal_list(store: Store) -> None:
    dag = DAG("literal")
    square = dag.task("p.square", id="square").expand(n=[1, 2, 3])
    dag.task("p.total", id="total", args=[square])
    engine, executor, run_id = started(store, dag)
    for i, value in enumerate((1, 4, 9)):
        succeed(engine, executor, f"square[{i}]", value)
    assert executor.pop("total").message.args == ([1, 4, 9],)


def test_a_crash_before_publishing_leaves_one_set_published_later(store: Store) -> None:
    """The instances commit with the upstream's success: a scheduler that dies before it
    publishes them leaves them claimed, and another publishes that same set."""
    engine, executor, run_id = started(store, mapped_dag())

    def die(tis: object) -> None:
        raise KeyboardInterrupt("killed")
    engine.before_publish = die
    with pytest.raises(KeyboardInterrupt):
        succeed(engine, executor, "extract", [1, 2, 3])
    assert executor.sent == []
    other_executor = RecordingExecutor()
    other = Engine(store, {"queue": other_executor}, dags={"mapped": mapped_dag()})
    other.tick(T0 + 100)       # the dead scheduler's lease (5 s) lapsed
    assert sorted(other_executor.task_ids()) == ["process[0]", "process[1]", "process[2]"]
    assert sum(1 for t in states(store, run_id) if t.startswith("process[")) == 3


def test_clear_one_index_runs_it_again_and_the_reduce_after_it(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", ["a", "b"])
    succeed(engine, executor, "process[0]", "A")
    succeed(engine, executor, "process[1]", "B")
    succeed(engine, executor, "reduce", "AB")
    assert clear(store, run_id, "process[1]", T0 + 10) == ["process[1]", "reduce"]
    assert states(store, run_id)["process"] == "running"
    engine.tick(T0 + 11)
    assert executor.task_ids() == ["process[1]"]
    succeed(engine, executor, "process[1]", "B2", T0 + 12)
    assert executor.pop("reduce").message.args == (["A", "B2"],)


def test_clearing_the_mapped_task_expands_it_again(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", ["a"])
    succeed(engine, executor, "process[0]", "A")
    succeed(engine, executor, "reduce", "done")
    clear(store, run_id, "extract", T0 + 10)
    engine.tick(T0 + 11)
    succeed(engine, executor, "extract", ["x", "y"], T0 + 12)
    assert sorted(executor.task_ids()) == ["process[0]", "process[1]"]
    assert executor.pop("process[0]").message.kwargs["item"] == "x"


def test_marking_an_instance_failed_fails_the_mapped_task(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", ["a", "b"])
    succeed(engine, executor, "process[0]", "A")
    succeed(engine, executor, "process[1]", "B")
    mark(store, run_id, "process[0]", "failed", T0 + 10)
    engine.tick(T0 + 11)
    assert states(store, run_id)["process"] == "failed"


def test_fixed_upstream_arguments_reach_every_instance_and_the_context_its_index(
        store: Store) -> None:
    dag = DAG("fixed")
    settings = dag.task("p.settings", id="settings")
    extract = dag.task("p.extract", id="extract")
    dag.task("p.process", settings, id="process").expand(item=extract)
    engine, executor, run_id = started(store, dag)
    succeed(engine, executor, "settings", {"scale": 3})
    succeed(engine, executor, "extract", [7, 8])
    message = executor.pop("process[1]").message
    assert (message.args, message.kwargs) == (({"scale": 3},), {"item": 8})
    wire = {"id": "m", "headers": message.headers}
    assert TaskContext.from_wire(wire).map_index == 1
    assert TaskContext.from_wire({"headers": {}}).as_environment()["CONVEYOR_CTX_MAP_INDEX"] \
        == "-1"


def test_cancelling_a_mapped_task_cancels_its_unfinished_instances(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    succeed(engine, executor, "extract", ["a", "b"])
    succeed(engine, executor, "process[0]", "A")
    cancelled: list[str] = []
    cancel_task(store, run_id, "process", T0 + 5, cancelled.append)
    found = states(store, run_id)
    assert (found["process"], found["process[0]"], found["process[1]"], found["reduce"]) == (
        "cancelled", "success", "cancelled", "upstream_failed")
    assert len(cancelled) == 1              # the attempt of process[1] a worker may hold


def test_a_mapped_task_can_map_over_another_mapped_tasks_results(store: Store) -> None:
    dag = DAG("chained")
    first = dag.task("p.double", id="double").expand(n=[1, 2])
    dag.task("p.show", id="show").expand(value=first)
    engine, executor, run_id = started(store, dag)
    succeed(engine, executor, "double[0]", 2)
    succeed(engine, executor, "double[1]", 4)
    assert [executor.pop(f"show[{i}]").message.kwargs for i in (0, 1)] == [
        {"value": 2}, {"value": 4}]


def test_a_redelivered_upstream_success_creates_no_second_set(store: Store) -> None:
    engine, executor, run_id = started(store, mapped_dag())
    success = event(executor.pop("extract"), "succeeded", T0 + 1, result=[1, 2])
    engine.handle(success, T0 + 1)
    engine.handle(success, T0 + 2)          # the broker delivered it again
    assert sorted(executor.task_ids()) == ["process[0]", "process[1]"]
    assert sum(1 for t in states(store, run_id) if t.startswith("process[")) == 2


def test_the_scheduler_reads_its_limit_from_conveyor_max_map_length() -> None:
    assert SchedulerConfig.from_env({}).max_map_length == 1024
    assert SchedulerConfig.from_env({"CONVEYOR_MAX_MAP_LENGTH": "5"}).max_map_length == 5
    with pytest.raises(ConfigError, match="MAX_MAP_LENGTH='0' is not allowed"):
        SchedulerConfig.from_env({"CONVEYOR_MAX_MAP_LENGTH": "0"})


@pytest.mark.parametrize(("rule", "reduce_state"), [("all_success", "skipped"),
                                                     ("none_failed", "queued")])
def test_an_instance_that_skips_itself_skips_the_mapped_task_once_all_ended(
        store: Store, rule: str, reduce_state: str) -> None:
    """As in Airflow: an all_success reduce is skipped; a none_failed one runs and gets None
    for the skipped element."""
    dag = DAG("skip_map")
    extract = dag.task("p.extract", id="extract")
    process = dag.task("p.process", retries=2).expand(item=extract)
    dag.task("p.reduce", id="reduce", args=[process], trigger_rule=rule)
    dag.validate(["queue"])
    engine, executor, run_id = started(store, dag)
    succeed(engine, executor, "extract", [1, 2])
    engine.handle(event(executor.pop("process[0]"), "skipped", T0 + 2, reason="odd"), T0 + 2)
    assert states(store, run_id)["process"] == "running"
    succeed(engine, executor, "process[1]", "B", T0 + 3)
    found = states(store, run_id)
    assert (found["process[0]"], found["process"], found["reduce"]) == (
        "skipped", "skipped", reduce_state)
    if reduce_state == "queued":
        assert executor.pop("reduce").message.args == ([None, "B"],)
    else:                            # a skipped map runs again when an instance is cleared
        clear(store, run_id, "process[0]", T0 + 4)
        assert states(store, run_id)["process"] == "running"
