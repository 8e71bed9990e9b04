"""Deferred tasks end to end: real `conveyor scheduler`, `worker` and `triggerer`
processes on SQLite and on Postgres. Ten tasks deferred on files hold no worker slot (a
one-slot worker runs another DAG's task while they wait), resume with their trigger's
payload once their files appear, and one whose file never comes fails `timed_out`. A
SIGKILLed triggerer's triggers are taken over by two others, and every task resumes once
(a task run twice would write its line twice). A `dag.wait_for_file` sensor hands its
file's payload to its child; a user-written trigger fires with its own payload, and one
that raises fails its task with the error. A task deferred on an asset (and a
`dag.wait_for_asset` sensor) resumes on the `conveyor assets touch` made after it
deferred, not on one made before, with the event's extra in its payload."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.store import Store, from_url
from conveyor.state.triggers import Triggers
from tests.integration.dagstack import dag_stack, ledger_lines, trigger_run
from tests.support import conveyor, spawn, stop, wait_for

WAITERS = 10

DAG_FILE = '''\
from conveyor import DAG, Defer, context, task
from conveyor.triggers import AssetTrigger, FileTrigger
from tests.integration.trigger_kinds import Broken, Countdown

LEDGER = {ledger!r}
FILES = {files!r}


def note(line):
    with open(LEDGER, "a") as out:
        out.write(line + "\\n")


@task(name="defertest.wait", max_retries=0)
def wait(name, timeout):
    event = context.trigger_event
    if event is None:
        note("deferring:" + name)
        raise Defer(FileTrigger(FILES + "/" + name, poll_interval=0.2), timeout=timeout)
    note(f"resumed:{{name}}:{{event['size']}}:{{context.attempt}}")
    return event["size"]


@task(name="defertest.other")
def other():
    note("other")


@task(name="defertest.custom", max_retries=0)
def custom(kind):
    if context.trigger_event is None:
        raise Defer(Countdown(3) if kind == "countdown" else Broken(), timeout=300)
    note(f"custom:{{context.trigger_event['counted']}}")


@task(name="defertest.on_asset", max_retries=0)
def on_asset():
    event = context.trigger_event
    if event is None:
        raise Defer(AssetTrigger("s3://lake/orders", poll_interval=0.2), timeout=300)
    note(f"asset:{{event['uri']}}:{{event['extra']['n']}}:{{event['source']}}")


@task(name="defertest.after")
def after(landed):
    note(f"after:{{landed['size']}}")


@task(name="defertest.after_asset")
def after_asset(event):
    note(f"after_asset:{{event['event_id']}}:{{event['extra']['n']}}")


waits = DAG("waits")
for i in range({waiters}):
    waits.task(wait, id=f"w{{i}}", args=(f"f{{i}}", 300))
waits.task(wait, id="never", args=("never", {never_timeout}))
waits.task(custom, id="countdown", args=("countdown",))
waits.task(custom, id="broken", args=("broken",))
waits.task(after, waits.wait_for_file(FILES + "/sensed", timeout=300, poll_interval=0.2))
waits.task(on_asset, id="on_asset")
waits.task(after_asset, waits.wait_for_asset("s3://lake/orders", id="asset_sensor", timeout=300,
                                        poll_interval=0.2), id="after_asset")
others = DAG("others")
others.task(other)
'''


def write_dag(tmp_path: Path, never_timeout: float) -> str:
    (tmp_path / "files").mkdir()
    return DAG_FILE.format(ledger=str(tmp_path / "ledger"), files=str(tmp_path / "files"),
                           waiters=WAITERS, never_timeout=never_timeout)


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with dag_stack(state_url, unique, tmp_path, "defertest.py",
                   write_dag(tmp_path, 3)) as made:
        yield made


def states(store: Store, run_id: str) -> dict[str, str]:
    return {row["task_id"]: row["state"] for row in store.rows("run_tis", run_id=run_id)}


def waiting(store: Store, run_id: str) -> int:
    """How many of the waiters on files that come (w0..., the sensor) are deferred."""
    return sum(state == "deferred" for task_id, state in states(store, run_id).items()
               if task_id.startswith("w"))


def test_deferred_tasks_free_their_slot_resume_once_through_a_killed_triggerers_heirs(
        env: dict[str, str], tmp_path: Path) -> None:
    """One stack per database for all of it (each start costs seconds): the waiters defer
    on a triggerer with a 2 s lease, another DAG's task runs on the one slot, the triggerer
    is SIGKILLed holding every trigger, two others take them over, the files appear."""
    worker = spawn("worker", "--queues", "default", "--concurrency", "1", env=env)
    scheduler = spawn("scheduler", env=env)
    first = spawn("triggerer", "--poll", "0.2", "--lease", "2", env=env)
    heirs: list[subprocess.Popen[bytes]] = []
    store = from_url(env["CONVEYOR_STATE_URL"])
    touch = ("assets", "touch", "s3://lake/orders", "--extra")
    try:
        conveyor(*touch, '{"n": 0}', env=env)   # before: fires nothing
        run_id = trigger_run(env, "waits")
        wait_for(lambda: waiting(store, run_id) == WAITERS + 1, timeout=90,
                 what="every waiter deferred", detail=lambda: str(states(store, run_id)))
        wait_for(lambda: all(states(store, run_id)[t] == "deferred"
                             for t in ("on_asset", "asset_sensor")), timeout=90,
                 what="the asset waiters deferred", detail=lambda: str(states(store, run_id)))
        trigger_run(env, "others")   # the one slot is free: another DAG's task runs
        wait_for(lambda: "other" in ledger_lines(tmp_path), timeout=60,
                 what="a task to run on the one slot while ten tasks wait")
        assert waiting(store, run_id) == WAITERS + 1
        wait_for(lambda: Triggers(store).counts(time.time())["running"] >= WAITERS + 1,
                 timeout=30, what="the first triggerer to claim every trigger")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        heirs += [spawn("triggerer", "--poll", "0.2", "--lease", "2", env=env)
                  for _ in range(2)]
        for i in range(WAITERS):
            (tmp_path / "files" / f"f{i}").write_text("x" * i)
        (tmp_path / "files" / "sensed").write_text("sensed")
        touched = json.loads(conveyor(*touch, '{"n": 1}', "--json", env=env).stdout)
        wait_for(lambda: all(s in ("success", "failed") for s in states(store, run_id).values()),
                 timeout=90, what="every waiter to end", detail=lambda: str(states(store, run_id)))
        tis = {row["task_id"]: row for row in store.rows("run_tis", run_id=run_id)}
    finally:
        store.close()
        for proc in (*heirs, scheduler, worker):
            stop(proc)
        stop(first)
    resumed = [line for line in ledger_lines(tmp_path) if line.startswith("resumed:")]
    assert sorted(resumed) == sorted(f"resumed:f{i}:{i}:1" for i in range(WAITERS))
    assert all(tis[f"w{i}"]["state"] == "success" for i in range(WAITERS))
    assert "after:6" in ledger_lines(tmp_path)   # dag.wait_for_file's payload, downstream
    assert "asset:s3://lake/orders:1:cli" in ledger_lines(tmp_path)   # AssetTrigger
    # dag.wait_for_asset's payload, downstream: the event touched after it deferred
    assert f"after_asset:{touched['event_id']}:1" in ledger_lines(tmp_path)
    assert "custom:3" in ledger_lines(tmp_path)   # a user-written trigger's payload
    assert tis["broken"]["state"] == "failed"
    assert "RuntimeError: the endpoint is gone" in tis["broken"]["error"]
    assert tis["never"]["state"] == "failed"
    assert "timed_out" in tis["never"]["error"]
