"""Runs pinned to their code, end to end: a real scheduler and two workers announcing
different code versions, on SQLite and Postgres state.

The run `first >> second >> third` is pinned (`pin_code=True`). `first` starts on the old
worker (v1): the run records v1. A new worker (v2) starts and sits idle; `second` still goes
to the old one. The old worker then stops while `second` runs (it drains): `third` is held
for v1 (or, sent to `default@v1` just before the old one left, is stranded there, and at
its deadline to start sent again, uncharged: retries=0), says so (`runs show`: waiting for
a worker of code version v1), and after `pin_timeout` moves to any worker (policy
`newest`): the new one. Each task runs once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor.cli.runs import show_run, show_source
from conveyor.readers.runs import run_detail, run_source
from conveyor.scheduler import DAG
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.runs import create_run
from conveyor.state.monitoring import Workers
from conveyor.state.store import Store, from_url
from tests.integration.workerkit import ROOT
from tests.support import conveyor, spawn, wait_for

DAG_FILE = """\
from conveyor.scheduler import DAG
dag = DAG("pinned", retries=0, queued_timeout=3, pin_code=True, pin_timeout=12,
          pin_policy="newest")
def step(name, gate):
    return dag.command(name, ["sh", "-c", f"while [ ! -e {{gate}} ]; do sleep 0.05; done; "
                                          f"echo {{name}} >> {ledger}"])
step("first", {go1!r}) >> step("second", {go2!r}) >> step("third", "/")
"""


def detail(store: Store, run_id: str) -> dict[str, Any]:
    found = run_detail(store, run_id)
    assert found is not None
    return found


def task(store: Store, run_id: str, task_id: str) -> dict[str, Any]:
    return next(t for t in detail(store, run_id)["tasks"] if t["task_id"] == task_id)


def states(store: Store, run_id: str) -> str:
    """Where each task stands, for a failure's message."""
    return json.dumps([(t["task_id"], t["state"], t["attempt"], t["hostname"],
                        t["waiting_for"], t["error"]) for t in detail(store, run_id)["tasks"]])


def test_a_pinned_run_stays_on_its_code_then_moves_on_when_it_is_gone(
        state_url: str, tmp_path: Path, processes: list[subprocess.Popen[Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    dags, ledger, go1, go2 = (tmp_path / n for n in ("dags", "ledger", "go1", "go2"))
    dags.mkdir()
    (dags / "pinned.py").write_text(DAG_FILE.format(ledger=str(ledger), go1=str(go1),
                                                    go2=str(go2)))
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": state_url, "CONVEYOR_DAGS_FOLDER": str(dags),
           "CONVEYOR_LOG_LEVEL": "WARNING"}

    def worker(name: str, version: str) -> subprocess.Popen[bytes]:
        proc = spawn("worker", "--queues", "default", "--concurrency", "1", "--hostname", name,
                     "--code-version", version, "--heartbeat-interval", "0.5", env=env)
        processes.append(proc)
        return proc

    old = worker("old", "v1")
    processes.append(spawn("scheduler", env=env))
    run_id = json.loads(conveyor("dags", "trigger", "pinned", "--json", env=env).stdout)[
        "run_id"]
    store = from_url(state_url)
    try:
        wait_for(lambda: task(store, run_id, "first")["state"] == "running", 30, "first runs")
        assert detail(store, run_id)["run"]["code_version"] == "v1"
        worker("new", "v2")
        wait_for(lambda: any(w.hostname == "new" for w in Workers(store).all()), 30,
                 "the new worker in the registry")
        go1.touch()
        wait_for(lambda: task(store, run_id, "second")["state"] == "running", 30,
                 "second runs")
        assert task(store, run_id, "second")["hostname"] == "old"   # the idle v2 waits
        old.send_signal(signal.SIGTERM)   # drains: second ends on it, then it leaves
        go2.touch()
        wait_for(lambda: old.poll() is not None, 30, "the old worker to stop")
        said = wait_for(lambda: detail(store, run_id)["code"]["waiting"], 30,
                        "third held for a v1 worker",
                        detail=lambda: states(store, run_id))
        assert said == {"third": "waiting for a worker of code version v1"}
        show_run(store, run_id, as_json=False)     # in-process: the hold lasts pin_timeout
        shown = capsys.readouterr().out
        assert "code version v1, pinned" in shown and "third: waiting for a worker" in shown
        wait_for(lambda: detail(store, run_id)["run"]["state"] == "success", 60,
                 "the run to end", detail=lambda: states(store, run_id))
        hosts = {t["task_id"]: t["hostname"] for t in detail(store, run_id)["tasks"]}
        assert hosts == {"first": "old", "second": "old", "third": "new"}
        third = task(store, run_id, "third")   # stranded if sent before the old one left
        assert [(a["attempt"], a["outcome"]) for a in detail(store, run_id)["attempts"]
                if a["ti_id"] == third["ti_id"]] in ([(1, "stranded"), (2, "succeeded")],
                                                     [(1, "succeeded")])
        assert sorted(ledger.read_text().split()) == ["first", "second", "third"]
        source = run_source(store, run_id)
        assert source is not None and "pin_code=True" in source["source"]
    finally:
        store.close()


def test_a_run_shows_the_source_it_was_created_from_after_the_file_changed(
        state_url: str, tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": state_url, "CONVEYOR_DAGS_FOLDER": str(dags)}
    runs = []
    for text, flags in (("before", ()), ("after", ("--pin-code",))):
        (dags / "edited.py").write_text("from conveyor.scheduler import DAG\n"
                                        f"dag = DAG('edited')  # {text}\n"
                                        "dag.command('only', ['true'])\n")
        runs.append(json.loads(conveyor("dags", "trigger", "edited", "--json", *flags,
                                        env=env).stdout)["run_id"])
    shown = [conveyor("runs", "show", run_id, "--source", env=env).stdout for run_id in runs]
    assert "# before" in shown[0] and "# after" not in shown[0]
    assert "# after" in shown[1]
    assert shown[0].startswith(f"# {dags / 'edited.py'} (version ")
    store = from_url(state_url)
    try:
        assert [detail(store, r)["code"]["pinned"] for r in runs] == [False, True]
        kept = run_source(store, runs[0])
        assert kept is not None and kept["source"].endswith("dag.command('only', ['true'])\n")
        with pytest.raises(RunError, match="no run 'no-such-run'"):
            show_source(store, "no-such-run", as_json=False)
        built = DAG("built")          # in a process, not from a file: no source to keep
        built.command("only", ["true"])
        unkept = create_run(store, built, time.time(), executors=["queue"])
        assert unkept is not None
        with pytest.raises(RunError, match="was not kept"):
            show_source(store, unkept, as_json=False)
    finally:
        store.close()


CRASH_DAG = """\
from conveyor.scheduler import DAG
dag = DAG("held", retries=0, pin_code=True, pin_timeout=2, pin_policy="newest")
dag.command("first", ["sh", "-c", "echo first >> {ledger}"], queue="{only_v1}") >> \\
    dag.command("second", ["sh", "-c", "echo second >> {ledger}"])
"""


def test_a_scheduler_killed_while_holding_a_task_loses_and_repeats_nothing(
        state_url: str, tmp_path: Path, processes: list[subprocess.Popen[Any]],
        unique: str) -> None:
    """`first` runs on the only v1 worker, which serves another queue than `second`'s:
    `second` is held. The scheduler is SIGKILLed when it looks at the hold again; the next
    one takes it over once the dead one's lease lapses, and (policy newest) the v2 worker
    runs it, once (SQLite and Postgres state)."""
    dags, ledger = tmp_path / "dags", tmp_path / "ledger"
    dags.mkdir()
    (dags / "held.py").write_text(CRASH_DAG.format(ledger=ledger, only_v1=unique))
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": state_url, "CONVEYOR_DAGS_FOLDER": str(dags),
           "CONVEYOR_LOG_LEVEL": "WARNING"}
    for queue, version in ((unique, "v1"), ("default", "v2")):
        processes.append(spawn("worker", "--queues", queue, "--code-version", version,
                               "--heartbeat-interval", "0.5", env=env))
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_HOLDING": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(crashing)
    run_id = json.loads(conveyor("dags", "trigger", "held", "--json", env=env).stdout)["run_id"]
    assert crashing.wait(60) == -9, "the scheduler should have died looking at its hold"
    store = from_url(state_url)
    try:
        assert task(store, run_id, "second")["waiting_for"] == "v1"
        assert task(store, run_id, "second")["published_at"] is None
        processes.append(spawn("scheduler", env=env))
        wait_for(lambda: detail(store, run_id)["run"]["state"] == "success", 60,
                 "the run to end", detail=lambda: states(store, run_id))
        assert [(t["task_id"], t["attempt"]) for t in detail(store, run_id)["tasks"]] == [
            ("first", 1), ("second", 1)]
    finally:
        store.close()
    assert sorted(ledger.read_text().split()) == ["first", "second"]
