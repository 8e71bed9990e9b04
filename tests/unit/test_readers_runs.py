"""The run readers the CLI and the dashboard share, over SQLite and Postgres: the run list's
filters, one run with its edges and attempts, and the grid of a DAG's newest runs."""

from __future__ import annotations

from conveyor.readers import runs as readers
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store

DAY = 86400.0


def dag(dag_id: str) -> DAG:
    d = DAG(dag_id)
    a = d.command("a", ["true"])
    d.command("b", ["true"], upstream=[a])
    d.command("c", ["true"], upstream=[a])
    return d


def test_runs_are_found_by_dag_state_and_logical_date(store: Store) -> None:
    ids = {}
    for day in range(5):
        for name in ("x", "y"):
            ids[name, day] = create_run(store, dag(name), 1000.0 + day, executors=["queue"],
                                        logical_date=day * DAY)
    newest_first = [r["run_id"] for r in readers.find_runs(store, dag_id="x")]
    assert newest_first == [ids["x", day] for day in (4, 3, 2, 1, 0)]
    window = readers.find_runs(store, since=1 * DAY, until=3 * DAY)
    assert {(r["dag_id"], r["logical_date"]) for r in window} == {
        (n, d * DAY) for n in ("x", "y") for d in (1, 2)}
    assert readers.find_runs(store, state="failed") == []
    assert len(readers.find_runs(store, state="queued", limit=3)) == 3


def test_one_run_carries_its_edges_and_the_grid_its_dags_newest_runs(store: Store) -> None:
    run_ids = [create_run(store, dag("x"), 1000.0 + day, executors=["queue"],
                          logical_date=day * DAY) for day in range(3)]
    detail = readers.run_detail(store, run_ids[0])
    assert detail is not None
    assert sorted(map(tuple, detail["edges"])) == [("a", "b"), ("a", "c")]
    order = dag("x").order()   # position: the DAG's topological order
    assert [t["task_id"] for t in detail["tasks"]] == order
    assert detail["attempts"] == [] and readers.run_detail(store, "nope") is None
    grid = store.rows("dag_grid", dag_id="x", limit=2)
    assert [(r["run_id"], r["task_id"]) for r in grid] == [
        (run_id, task) for run_id in run_ids[1:] for task in order]
    assert {r["run_state"] for r in grid} == {"queued"}
