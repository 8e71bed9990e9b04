"""Assets and events end to end: real `conveyor scheduler`s and a `conveyor worker` on SQLite
and on Postgres. A task's outlet starts the DAG consuming it once, with two schedulers
running, its tasks seeing the event (its extra: what the producer returned, and set through
its context); an event sent with `conveyor events send` starts a run with its payload as
conf, a re-sent dedupe key starting nothing. And a scheduler SIGKILLed with the event
recorded and no run, or with the run inserted and its events not yet consumed, leaves a run
created exactly once by the next scheduler. Prints event -> consumer run started."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.assets import Assets
from conveyor.state.store import Store, from_url
from tests.integration.dagstack import dag_stack, ledger_lines, trigger_run
from tests.support import conveyor, spawn, stop, wait_for

ROOT = Path(__file__).parents[2]
ORDERS = "s3://lake/orders"

DAG_FILE = '''\
from conveyor import DAG, Asset, Event, context, task

LEDGER = {ledger!r}
ORDERS = Asset("s3://lake/orders")


def note(line):
    with open(LEDGER, "a") as out:
        out.write(line + "\\n")


@task(name="assettest.extract")
def extract():
    note("extract")
    context.set_asset_extra(ORDERS, {{"by": context.task_id}})
    return {{"rows": 42}}


@task(name="assettest.report")
def report():
    note("report:" + ",".join(f"{{e['uri']}}={{e['extra']['rows']}}/{{e['extra']['by']}}"
                              for e in context.triggering_asset_events))


@task(name="assettest.on_paid")
def on_paid():
    note("paid:" + str(context.conf["invoice"]))


produce = DAG("produce")
produce.task(extract, outlets=[ORDERS])
consume = DAG("consume", schedule=[ORDERS])
consume.task(report)
paid = DAG("paid", schedule=Event("invoice.paid"))
paid.task(on_paid)
'''


@pytest.fixture
def env(state_url: str, unique: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    with dag_stack(state_url, unique, tmp_path, "assettest.py",
                   DAG_FILE.format(ledger=str(tmp_path / "ledger"))) as made:
        yield made


def runs(store: Store, dag_id: str) -> list[dict[str, object]]:
    return store.rows("recent_runs", dag_id=dag_id, state="", limit=100)


def latency(store: Store, uri: str, dag_id: str) -> float:
    """Seconds from the (first) event of `uri` to the start of `dag_id`'s first run."""
    (run,) = runs(store, dag_id)[-1:]
    event = Assets(store).events(uri, 100)[-1]
    return float(run["started_at"]) - event.created_at  # type: ignore[arg-type]


def test_an_outlet_starts_its_consumer_once_and_an_event_its_run_with_two_schedulers(
        env: dict[str, str], tmp_path: Path) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    schedulers = [spawn("scheduler", env=env), spawn("scheduler", env=env)]
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        trigger_run(env, "produce")
        wait_for(lambda: "report:s3://lake/orders=42/extract" in ledger_lines(tmp_path), timeout=60,
                 what="the consumer DAG to run", detail=lambda: str(ledger_lines(tmp_path)))
        for key, invoice in (("inv-1", 1), ("inv-1", 1), ("inv-2", 2)):
            conveyor("events", "send", "invoice.paid", "--payload",
                     f'{{"invoice": {invoice}}}', "--dedupe-key", key, env=env)
        wait_for(lambda: len([r for r in runs(store, "paid") if r["state"] == "success"]) == 2,
                 timeout=60, what="two runs of the event DAG")
        wait_for(lambda: all(r["state"] == "success" for r in runs(store, "consume")),
                 what="the consumer run to end")
        asset_ms = latency(store, ORDERS, "consume") * 1000
        event_ms = latency(store, "event:invoice.paid", "paid") * 1000
    finally:
        store.close()
        for proc in (*schedulers, worker):
            stop(proc)
    assert ledger_lines(tmp_path) == ["extract", "paid:1", "paid:2",
                                      "report:s3://lake/orders=42/extract"]
    print(f"\nevent -> consumer run started: outlet {asset_ms:.0f} ms, "
          f"`events send` {event_ms:.0f} ms")


@pytest.mark.parametrize("point", ["before_run", "before_consume"])
def test_a_scheduler_killed_between_event_and_run_starts_the_run_once(
        env: dict[str, str], tmp_path: Path, point: str) -> None:
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", env=env)
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_ASSETS": point},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    survivor: subprocess.Popen[bytes] | None = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        trigger_run(env, "produce")
        assert crashing.wait(60) == -9, "the scheduler should have died at " + point
        assert runs(store, "consume") == []
        assert [e.uri for e in Assets(store).queued(10)["consume"]] == [ORDERS]
        survivor = spawn("scheduler", "--burst", env=env)
        assert survivor.wait(90) == 0
        consumed = runs(store, "consume")
        queued = Assets(store).queued(10)
    finally:
        store.close()
        for proc in (crashing, survivor, worker):
            if proc is not None:
                stop(proc)
    assert [r["state"] for r in consumed] == ["success"]
    assert queued == {}
    assert ledger_lines(tmp_path) == ["extract", "report:s3://lake/orders=42/extract"]
