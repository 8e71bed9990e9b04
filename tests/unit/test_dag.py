"""The DAG model: dependencies, option layers, and errors that name the declaring line."""

from __future__ import annotations

import inspect

import pytest

from conveyor.scheduler import DAG, DagError
from conveyor.tasks import task


def line_here() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


@task(name="tests.dag.extract", queue="heavy", max_retries=5, memory_limit="1MiB")
def extract() -> int:
    return 1


def test_operators_build_edges_with_lists_on_either_side() -> None:
    dag = DAG("d")
    a, b, c, d = (dag.command(n, ["true"]) for n in "abcd")
    a >> [b, c]
    [b, c] >> d
    assert sorted(dag.edges()) == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    order = dag.order()
    assert order.index("a") < order.index("b") < order.index("d")


def test_lshift_and_chains() -> None:
    dag = DAG("d")
    a, b, c = (dag.command(n, ["true"]) for n in "abc")
    c << b << a
    assert sorted(dag.edges()) == [("a", "b"), ("b", "c")]
    assert dag.order() == ["a", "b", "c"]


def test_option_layers_task_then_dag_defaults_then_keywords() -> None:
    dag = DAG("d", retries=2, priority=3)
    node = dag.task(extract)
    assert (node.id, node.task) == ("extract", "tests.dag.extract")
    assert node.options.queue == "heavy"              # from @task
    assert node.options.memory_limit == 1024 * 1024   # from @task
    assert node.options.retries == 2                  # DAG default beats @task's 5
    assert node.options.priority == 3
    other = dag.task(extract, id="extract2", retries=0, memory_limit="2MiB")
    assert other.options.retries == 0 and other.options.memory_limit == 2 * 1024 * 1024
    assert other.options.max_attempts == 1


def test_task_by_name_takes_the_last_dotted_part_as_id() -> None:
    dag = DAG("d")
    assert dag.task("billing.tasks.load").id == "load"


def test_unknown_option_names_the_line() -> None:
    dag = DAG("d")
    with pytest.raises(DagError) as error:
        line = line_here() + 1
        dag.command("a", ["true"], retires=3)
    assert f"test_dag.py:{line}" in str(error.value)
    assert "unknown task option(s) retires" in str(error.value)


def test_duplicate_task_id_names_both_lines() -> None:
    dag = DAG("d")
    first = line_here() + 1
    dag.command("a", ["true"])
    with pytest.raises(DagError, match=f"already has a task 'a' \\(declared at .*:{first}\\)"):
        dag.command("a", ["false"])


def test_plain_function_is_refused() -> None:
    def not_registered() -> None: ...

    with pytest.raises(DagError, match="is not a registered task"):
        DAG("d").task(not_registered)  # type: ignore[arg-type]


def test_bad_command_and_bad_ranges() -> None:
    dag = DAG("d")
    with pytest.raises(DagError, match="non-empty list of strings"):
        dag.command("a", "echo hi")  # type: ignore[arg-type]
    with pytest.raises(DagError, match="out of range"):
        dag.command("b", ["true"], retries=-1)
    with pytest.raises(DagError, match="is not a size"):
        dag.command("c", ["true"], memory_limit="lots")


def test_cycle_names_the_tasks_and_the_edge() -> None:
    dag = DAG("d")
    a, b, c = (dag.command(n, ["true"]) for n in "abc")
    a >> b >> c
    line = line_here() + 1
    c >> a
    with pytest.raises(DagError) as error:
        dag.validate()
    assert f":{line}: DAG 'd' has a cycle: a -> b -> c -> a" in str(error.value)


def test_missing_dependency() -> None:
    dag = DAG("d")
    line = line_here() + 1
    dag.command("clean", ["true"], upstream=["extrat"])
    with pytest.raises(DagError) as error:
        dag.validate()
    assert f":{line}: task 'clean' of DAG 'd' depends on 'extrat'" in str(error.value)


def test_edge_to_another_dags_task() -> None:
    mine, theirs = DAG("mine"), DAG("theirs")
    a = mine.command("a", ["true"])
    b = theirs.command("b", ["true"])
    a >> b
    with pytest.raises(DagError, match="belongs to DAG 'mine'"):
        theirs.validate()


def test_unconfigured_executor() -> None:
    dag = DAG("d")
    line = line_here() + 1
    dag.command("train", ["true"], executor="kubernetes")
    dag.validate(["queue", "kubernetes"])
    with pytest.raises(DagError) as error:
        dag.validate(["queue", "local"])
    assert f":{line}: task 'train' of DAG 'd' uses executor 'kubernetes'" in str(error.value)
    assert "configured: queue, local" in str(error.value)


def test_bad_ids_schedules_and_empty_dags() -> None:
    with pytest.raises(DagError, match="DAG id 'a b'"):
        DAG("a b")
    with pytest.raises(DagError, match="not a cron expression"):
        DAG("d", schedule="61 * * * *")
    with pytest.raises(DagError, match="not an IANA zone"):
        DAG("d", schedule="0 3 * * *", timezone="Mars/Olympus")
    with pytest.raises(DagError, match="has no tasks"):
        DAG("empty").validate()


def test_long_chains_do_not_recurse() -> None:
    dag = DAG("chain")
    previous = dag.command("t0", ["true"])
    for i in range(1, 3000):
        node = dag.command(f"t{i}", ["true"])
        previous >> node
        previous = node
    dag.validate()
    assert dag.order()[-1] == "t2999"
