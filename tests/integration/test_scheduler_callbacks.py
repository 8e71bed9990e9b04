"""Callbacks and deadlines end to end: a real `conveyor scheduler` and `conveyor worker` on
SQLite and on Postgres. A failing task fires on_retry once per retry and on_failure once, with
its error's type and message; a DAG's on_success and on_failure fire when runs end; a
callback that raises is recorded failed and never touches its run; a deadline missed while no
worker runs is recorded on time and its callback runs once a worker comes; and a scheduler
SIGKILLed between recording a callback (on_retry, on_failure, on_cancel, a deadline's) and
publishing it loses and repeats nothing. The
callback task appends its context to a ledger, so every run of it is counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.state.store import Store, from_url
from tests.integration.dagstack import dag_stack, trigger_run
from tests.integration.private_servers import free_port
from tests.support import conveyor, spawn, stop, wait_for

ROOT = Path(__file__).parents[2]

DAG_FILE = '''\
import json

from conveyor import DAG, task
from conveyor.scheduler import Deadline, DeadlineReference

LEDGER = {ledger!r}


@task(name="cbtest.note")
def note(context):
    with open(LEDGER, "a") as out:
        out.write(json.dumps(context) + "\\n")


@task(name="cbtest.pager_down")
def pager_down(context):
    raise RuntimeError("the pager is down")


@task(name="cbtest.load")
def load():
    raise ValueError("bad row 7")


failing = DAG("cbfail", on_failure=note, on_success=note)
failing.task(load, retries=2, retry_delay=0, on_retry=note, on_failure=note)

fine = DAG("cbfine", on_success=note)
fine.command("ok", ["true"], on_success=pager_down)

late = DAG("cblate", on_success=note,
           deadline=Deadline(reference=DeadlineReference.QUEUED_AT, interval=1,
                             callback=note))
late.command("step", ["true"])

stopped = DAG("cbcancel", on_cancel=note)
stopped.command("long", ["sleep", "60"], on_cancel=note)
'''


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A DAG folder, a ledger, and a broker on the same database as the state store."""
    with dag_stack(state_url, unique, tmp_path, "cbtest.py",
                   DAG_FILE.format(ledger=str(tmp_path / "ledger"))) as made:
        yield made


def ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger"
    return [json.loads(line) for line in path.read_text().splitlines()] \
        if path.exists() else []


def fired(tmp_path: Path, run_id: str) -> list[tuple[str, str, Any]]:
    """(kind, task id or "run", attempt) of each callback run of `run_id`, sorted."""
    return sorted((c["kind"], c.get("task_id", "run"), c.get("attempt"))
                  for c in ledger(tmp_path) if c["run_id"] == run_id)


def run_state(store: Store, run_id: str) -> str:
    return str(store.one("run", run_id=run_id)["state"])


FAILED_RUN = [("on_failure", "load", 3), ("on_failure", "run", None),
              ("on_retry", "load", 1), ("on_retry", "load", 2)]


def test_failure_retries_and_run_ends_fire_their_callbacks_once(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    scheduler = spawn("scheduler", env=env)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        failing, fine = trigger_run(env, "cbfail"), trigger_run(env, "cbfine")
        wait_for(lambda: len(fired(tmp_path, failing)) == 4 and fired(tmp_path, fine),
                 timeout=60, what="the callbacks of both runs",
                 detail=lambda: str(ledger(tmp_path)))
        def broken() -> dict[str, Any]:
            return next(r for r in store.rows("run_callbacks", run_id=fine) if r["ti_id"])
        wait_for(lambda: broken()["state"] == "failed", timeout=30,
                 what="the broken callback's failure to be recorded")
        states = (run_state(store, failing), run_state(store, fine))
        failed = broken()
        shown = conveyor("runs", "show", fine, env=env).stdout
    finally:
        store.close()
        for proc in (scheduler, worker):
            stop(proc)
    assert fired(tmp_path, failing) == FAILED_RUN
    (failure,) = [c for c in ledger(tmp_path) if c["kind"] == "on_failure" and "task_id" in c]
    assert failure["error"]["type"] == "ValueError"
    assert failure["error"]["message"] == "bad row 7"
    assert "Traceback" in failure["error"]["traceback"]
    assert fired(tmp_path, fine) == [("on_success", "run", None)]   # pager_down raised
    assert states == ("failed", "success")
    assert failed["kind"] == "on_success" and "the pager is down" in failed["error"]
    assert "on_success of ok #1 -> cbtest.pager_down on default: failed" in shown


def scraped(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def test_a_deadline_missed_with_no_worker_is_recorded_and_fires_once(
        env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    scheduler = spawn("scheduler", "--metrics-port", str(port), env=env)
    worker = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "cblate")
        missed = wait_for(lambda: store.one("run", run_id=run_id)["deadline_missed_at"],
                          timeout=30, what="the deadline to be found missed")
        callback = wait_for(lambda: store.one("run_callbacks", run_id=run_id), timeout=30,
                            what="the deadline's callback to be recorded")
        assert callback["kind"] == "deadline"
        wait_for(lambda: store.one("run_callbacks", run_id=run_id)["state"] == "published",
                 timeout=30, what="the deadline's callback to be published")
        assert not ledger(tmp_path)          # recorded and queued: no worker to run it yet
        # the scheduler alone serves the alert while no worker is up
        wait_for(lambda: "conveyor_deadline_missed_total 1.0" in scraped(port), timeout=10,
                 what="the scheduler's /metrics to count the missed deadline")
        worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
        wait_for(lambda: len(fired(tmp_path, run_id)) == 2, timeout=60,
                 what="the deadline's callback and the run's on_success")
        shown = conveyor("runs", "show", run_id, env=env).stdout
        as_json = json.loads(conveyor("runs", "show", run_id, "--json", env=env).stdout)
        run = store.one("run", run_id=run_id)
    finally:
        store.close()
        for proc in (scheduler, worker):
            if proc is not None:
                stop(proc)
    assert fired(tmp_path, run_id) == [("deadline", "run", None), ("on_success", "run", None)]
    assert run["state"] == "success" and run["deadline_missed_at"] == missed
    assert missed >= run["deadline_at"] == run["created_at"] + 1
    assert "MISSED" in shown and "deadline of run -> cbtest.note" in shown
    assert as_json["deadline"]["missed"] is True and as_json["deadline"]["status"] == "missed"


@pytest.mark.parametrize("kind", ["on_retry", "on_failure"])
def test_scheduler_killed_between_recording_and_publishing_a_callback(
        env: dict[str, str], tmp_path: Path, kind: str) -> None:
    """on_retry: killed publishing the first retry's (the run goes on); on_failure: the
    last attempt's and the run's, recorded as the run ended."""
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_CALLBACK": kind},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survivor = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "cbfail")
        assert crashing.wait(60) == -9, f"the scheduler should have died publishing {kind}"
        pending = [r for r in store.rows("run_callbacks", run_id=run_id)
                   if r["kind"] == kind]
        assert {r["state"] for r in pending} == {"pending"}   # recorded with the transition
        if kind == "on_failure":
            assert run_state(store, run_id) == "failed"  # ended in the same transaction
        else:
            load = store.one("run_ti_by_task", run_id=run_id, task_id="load")
            assert (load["state"], load["attempt"], run_state(store, run_id)) == (
                "up_for_retry", 1, "running")
        # a burst scheduler stays until what the dead one recorded is published
        survivor = spawn("scheduler", "--burst", env=env)
        assert survivor.wait(60) == 0
        assert {r["state"] for r in store.rows("run_callbacks", run_id=run_id)} <= {
            "published", "succeeded"}
        wait_for(lambda: len(fired(tmp_path, run_id)) >= 4, timeout=60,
                 what="the worker to run what the survivor published",
                 detail=lambda: str(ledger(tmp_path)))
    finally:
        store.close()
        for proc in (crashing, survivor, worker):
            if proc is not None:
                stop(proc)
    assert fired(tmp_path, run_id) == FAILED_RUN     # each once: none lost, none twice


def test_a_deadline_missed_by_a_scheduler_killed_before_publishing_fires_once(
        env: dict[str, str], tmp_path: Path) -> None:
    """No worker: the scheduler marks the deadline missed, records its callback and dies
    publishing it. Two schedulers take over (racing to claim it), then a worker starts."""
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_CALLBACK": "deadline"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    others: list[subprocess.Popen[bytes]] = []
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "cblate")
        assert crashing.wait(60) == -9, "the scheduler should have died publishing it"
        assert store.one("run", run_id=run_id)["deadline_missed_at"] is not None
        assert [(r["kind"], r["state"]) for r in store.rows("run_callbacks", run_id=run_id)
                ] == [("deadline", "pending")]
        others = [spawn("scheduler", env=env), spawn("scheduler", env=env)]
        others.append(spawn("worker", "--queues", "default", "--concurrency", "2", env=env))
        wait_for(lambda: {r["state"] for r in store.rows("run_callbacks", run_id=run_id)}
                 == {"succeeded"} and run_state(store, run_id) == "success", timeout=60,
                 what="the deadline's callback and the run's on_success to run",
                 detail=lambda: str(store.rows("run_callbacks", run_id=run_id)))
    finally:
        store.close()
        for proc in (crashing, *others):
            stop(proc)
    assert fired(tmp_path, run_id) == [("deadline", "run", None), ("on_success", "run", None)]


def test_cancelling_a_running_run_fires_on_cancel_of_the_task_and_the_run_once(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", "--cancel-grace",
                   "0.5", env=env)        # the cancelled `sleep 60` is stopped at once
    scheduler = spawn("scheduler", env=env)
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "cbcancel")
        wait_for(lambda: store.one("run_ti_by_task", run_id=run_id, task_id="long")["state"]
                 == "running", timeout=30, what="the long task to start")
        conveyor("runs", "cancel", run_id, env=env)
        wait_for(lambda: len(fired(tmp_path, run_id)) == 2, timeout=30,
                 what="on_cancel of the task and of the run",
                 detail=lambda: str(store.rows("run_callbacks", run_id=run_id)))
        state = run_state(store, run_id)
    finally:
        store.close()
        for proc in (scheduler, worker):
            stop(proc)
    assert state == "cancelled"
    assert fired(tmp_path, run_id) == [("on_cancel", "long", 1), ("on_cancel", "run", None)]


def test_scheduler_killed_publishing_on_cancel_loses_and_repeats_nothing(
        env: dict[str, str], tmp_path: Path) -> None:
    """Killed publishing the on_cancel callbacks recorded when the cancelled task's outcome
    ended the run: the next scheduler publishes each once."""
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", "--cancel-grace",
                   "0.5", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_CALLBACK": "on_cancel"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survivor = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = trigger_run(env, "cbcancel")
        wait_for(lambda: store.one("run_ti_by_task", run_id=run_id, task_id="long")["state"]
                 == "running", timeout=30, what="the long task to start")
        conveyor("runs", "cancel", run_id, env=env)
        assert crashing.wait(60) == -9, "the scheduler should have died publishing on_cancel"
        assert {(r["kind"], r["state"]) for r in store.rows("run_callbacks", run_id=run_id)
                if r["ti_id"]} == {("on_cancel", "pending")}
        survivor = spawn("scheduler", "--burst", env=env)
        assert survivor.wait(60) == 0
        wait_for(lambda: len(fired(tmp_path, run_id)) >= 2, timeout=60,
                 what="on_cancel of the task and of the run",
                 detail=lambda: str(store.rows("run_callbacks", run_id=run_id)))
        state = run_state(store, run_id)
    finally:
        store.close()
        for proc in (crashing, survivor, worker):
            if proc is not None:
                stop(proc)
    assert state == "cancelled"
    assert fired(tmp_path, run_id) == [("on_cancel", "long", 1), ("on_cancel", "run", None)]
