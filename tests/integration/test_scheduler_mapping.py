"""Dynamic task mapping end to end: a real `conveyor scheduler` and `conveyor worker` on
SQLite and on Postgres map a task over what its upstream returned (one instance retried on
its own), and the reduce after it gets the results in element order; a scheduler SIGKILLed
in the middle of creating the instances (rolled back with the upstream's success, which is
applied again from its redelivered event) or after creating and before publishing them
(committed, claimed, published by the next scheduler) leaves exactly one set of instances,
each run once; one killed once the map closed, its reduce claimed and not published, leaves
the reduce to the next, which runs it once; one killed as an instance's failure closes its
map (before or after that commits) leaves the map failed once, its all_done cleanup and the
instance's on_failure run once. A ledger counts every task's runs."""

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
import time

from conveyor import DAG, task

LEDGER = {ledger!r}


def note(name):
    with open(LEDGER, "a") as out:
        out.write(name + "\\n")


def runs_of(name):
    try:
        with open(LEDGER) as seen:
            return seen.read().split("\\n").count(name)
    except FileNotFoundError:
        return 0


@task(name="maptest.extract")
def extract():
    note("extract")
    return ["a", "b", "c", "d"]


@task(name="maptest.process")
def process(item, suffix):
    first = runs_of("process-" + item) == 0
    note("process-" + item)
    if item == "c" and first:
        raise RuntimeError("c fails once")
    return item.upper() + suffix


@task(name="maptest.total")
def total(values):
    note("total")
    return "".join(values)


dag = DAG("maptest", retries=1, retry_delay=0)
items = dag.task(extract)
upper = dag.task(process, kwargs={{"suffix": "!"}}).expand(item=items)
dag.task(total, args=[upper])


@task(name="maptest.fragile")
def fragile(item):
    if item == "b":             # fails last, so its failure is what closes the map
        while runs_of("fragile-a") == 0:
            time.sleep(0.05)
    note("fragile-" + item)
    if item == "b":
        raise RuntimeError("b always fails")
    return item


@task(name="maptest.cleanup")
def cleanup():
    note("cleanup")


@task(name="maptest.alert")
def alert(context):
    note("alert")


failing = DAG("mapfail", retries=0)
fragiles = failing.task(fragile, on_failure=alert).expand(item=["a", "b"])
fragiles >> failing.task(cleanup, trigger_rule="all_done")
'''

RAN = ["extract", "process-a", "process-b", "process-c", "process-c", "process-d", "total"]


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A DAG folder, a ledger, and a broker on the same database as the state store."""
    with dag_stack(state_url, unique, tmp_path, "maptest.py",
                   DAG_FILE.format(ledger=str(tmp_path / "ledger"))) as made:
        yield made


def outcome(store_url: str, run_id: str) -> tuple[str, dict[str, tuple[str, int]], object]:
    store = from_url(store_url)
    try:
        rows = store.rows("run_tis", run_id=run_id)
        run = store.one("run", run_id=run_id)
    finally:
        store.close()
    total = next(r["result"] for r in rows if r["task_id"] == "total")
    return run["state"], {r["task_id"]: (r["state"], r["attempt"]) for r in rows}, total


EXPECTED = {"extract": ("success", 1), "process": ("success", 1),
            "process[0]": ("success", 1), "process[1]": ("success", 1),
            "process[2]": ("success", 2), "process[3]": ("success", 1),
            "total": ("success", 1)}


def test_a_mapped_task_runs_per_element_and_its_reduce_gets_the_list(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    scheduler = spawn("scheduler", env=env)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "maptest")
        wait_for(lambda: store.one("run", run_id=run_id)["state"] in ("success", "failed"),
                 timeout=60, what="the run to end")
        shown = conveyor("runs", "show", run_id, env=env).stdout
    finally:
        store.close()
        for proc in (scheduler, worker):
            stop(proc)
    state, tasks, total = outcome(env["CONVEYOR_STATE_URL"], run_id)
    assert (state, tasks, total) == ("success", EXPECTED, '"A!B!C!D!"')
    assert ledger_lines(tmp_path) == RAN
    assert "success (4 mapped: 4 success)" in shown and "  process[2]" in shown


DIE_AT = {"expanding": {"CONVEYOR_TEST_DIE_EXPANDING": "1"},
          "publishing": {"CONVEYOR_TEST_DIE_PUBLISHING": "process[0]"},
          "reducing": {"CONVEYOR_TEST_DIE_PUBLISHING": "total"}}


@pytest.mark.parametrize("crash", sorted(DIE_AT))
def test_a_scheduler_killed_creating_or_publishing_instances_leaves_one_set(
        env: dict[str, str], tmp_path: Path, crash: str) -> None:
    """`reducing`: killed once the map closed and its reduce was claimed, not published."""
    die = DIE_AT[crash]
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, **die}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survivor: subprocess.Popen[bytes] | None = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "maptest")
        assert crashing.wait(60) == -9, "the scheduler should have died at the mapping step"
        instances = [r for r in store.rows("run_tis", run_id=run_id) if r["map_task"]]
        if crash == "expanding":     # rolled back with the upstream's success
            assert instances == []
            assert store.one("run_ti_by_task", run_id=run_id, task_id="extract")[
                "state"] in ("queued", "running")   # its `started` may be in the same batch
        elif crash == "publishing":  # committed, claimed, not published
            assert [(r["state"], r["published_at"]) for r in instances] == [
                ("queued", None)] * 4
        else:                        # the map closed with the reduce claimed, not published
            reduce = store.one("run_ti_by_task", run_id=run_id, task_id="total")
            assert (reduce["state"], reduce["published_at"]) == ("queued", None)
            assert store.one("run_ti_by_task", run_id=run_id, task_id="process")[
                "state"] == "success"
        survivor = spawn("scheduler", "--burst", env=env)
        assert survivor.wait(90) == 0
        wait_for(lambda: store.one("run", run_id=run_id)["state"] != "running", timeout=30,
                 what="the run to end")
    finally:
        store.close()
        for proc in (crashing, survivor, worker):
            if proc is not None:
                stop(proc)
    state, tasks, total = outcome(env["CONVEYOR_STATE_URL"], run_id)
    assert (state, tasks, total) == ("success", EXPECTED, '"A!B!C!D!"')
    assert ledger_lines(tmp_path) == RAN


CLOSING = {"closing": {"CONVEYOR_TEST_DIE_CLOSING": "1"},
           "closed": {"CONVEYOR_TEST_DIE_PUBLISHING": "cleanup"}}


@pytest.mark.parametrize("crash", sorted(CLOSING))
def test_a_scheduler_killed_as_a_failed_instance_closes_its_map_loses_and_repeats_nothing(
        env: dict[str, str], tmp_path: Path, crash: str) -> None:
    """`fragile[1]` fails after `fragile[0]` succeeded: its failure closes the map (failed).
    `closing`: killed with the map closed and the transaction not committed: the failure
    rolls back and is applied again from its redelivered event. `closed`: killed once that
    committed, with the all_done `cleanup` claimed and not published (and the instance's
    on_failure callback recorded, not published). The next scheduler ends the run: each
    task and the callback once."""
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, **CLOSING[crash]}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    survivor: subprocess.Popen[bytes] | None = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "mapfail")
        assert crashing.wait(60) == -9, "the scheduler should have died closing the map"
        tis = {r["task_id"]: r for r in store.rows("run_tis", run_id=run_id)}
        if crash == "closing":      # the failure rolled back with the close
            assert tis["fragile"]["state"] == "running"
            assert tis["fragile[1]"]["state"] in ("queued", "running")
            assert store.rows("run_callbacks", run_id=run_id) == []
        else:                       # committed; cleanup claimed, not published
            assert tis["fragile"]["state"] == "failed"
            assert (tis["cleanup"]["state"], tis["cleanup"]["published_at"]) == (
                "queued", None)
        survivor = spawn("scheduler", "--burst", env=env)
        assert survivor.wait(90) == 0
        wait_for(lambda: "alert" in ledger_lines(tmp_path), timeout=30,
                 what="the instance's on_failure callback to run")
    finally:
        store.close()
        for proc in (crashing, survivor, worker):
            if proc is not None:
                stop(proc)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        state = store.one("run", run_id=run_id)["state"]
        tasks = {r["task_id"]: (r["state"], r["attempt"])
                 for r in store.rows("run_tis", run_id=run_id)}
    finally:
        store.close()
    assert state == "failed"
    assert tasks == {"fragile": ("failed", 1), "fragile[0]": ("success", 1),
                     "fragile[1]": ("failed", 1), "cleanup": ("success", 1)}
    assert ledger_lines(tmp_path) == ["alert", "cleanup", "fragile-a", "fragile-b"]
