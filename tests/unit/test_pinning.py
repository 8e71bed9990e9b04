"""Runs pinned to their code, in the engine: where a pinned run's tasks are published (the
version its first task started on, while a live worker of it serves the queue), held with a
reason while none does, and moved on by `pin_policy` after `pin_timeout`; shown on the
dashboard's run and Workers pages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import cli
from conveyor.cli.status import collect
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.errors import DagError
from conveyor.scheduler.operations import clear
from conveyor.scheduler.runs import create_run
from conveyor.scheduler.sampler import queues_to_sample
from conveyor.state.monitoring import Workers
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.http import Request
from tests.support import RecordingExecutor, event


def pair(policy: str = "wait", timeout: float = 60.0, pin: bool = True) -> DAG:
    dag = DAG("pair", pin_code=pin, pin_timeout=timeout, pin_policy=policy)
    dag.command("first", ["true"]) >> dag.command("second", ["true"])
    dag.validate()
    return dag


def worker(store: Store, version: str, now: float, queues: str = "default") -> None:
    with store.transaction():
        Workers(store).beat(worker_id=f"w-{version}", hostname=f"host-{version}", pid=1,
                            queues=queues, concurrency=1, interval=10.0, started_at=now,
                            busy=0, now=now, runners=None, code_version=version)


def started_first(store: Store, dag: DAG, now: float, *, pin_code: bool | None = None
                  ) -> tuple[Engine, RecordingExecutor, str]:
    """A run whose first task started on a v1 worker and succeeded: `second` is dispatched."""
    sent = RecordingExecutor()
    engine = Engine(store, {"queue": sent}, dags={"pair": dag})
    run_id = create_run(store, dag, now, executors=["queue"], pin_code=pin_code)
    assert run_id is not None
    engine.tick(now)
    first = sent.pop("first")
    engine.handle(event(first, "started", now, code_version="v1"), now)
    engine.handle(event(first, "succeeded", now), now)
    return engine, sent, run_id


def second(store: Store, run_id: str) -> dict[str, Any]:
    return next(r for r in store.rows("run_tis", run_id=run_id) if r["task_id"] == "second")


def test_a_pinned_task_goes_to_its_versions_queue_while_a_worker_of_it_lives(
        store: Store) -> None:
    now = time.time()
    worker(store, "v1", now)
    worker(store, "v2", now)
    _, sent, run_id = started_first(store, pair(), now)
    assert sent.pop("second").message.queue == "default@v1"
    assert store.one("run", run_id=run_id)["code_version"] == "v1"


def test_an_unpinned_run_records_its_version_and_publishes_to_the_plain_queue(
        store: Store) -> None:
    now = time.time()
    worker(store, "v1", now)
    _, sent, run_id = started_first(store, pair(pin=False), now)
    assert sent.pop("second").message.queue == "default"
    assert store.one("run", run_id=run_id)["code_version"] == "v1"
    _, sent, _ = started_first(store, pair(pin=False), now + 1, pin_code=True)  # per run
    assert sent.pop("second").message.queue == "default@v1"


def test_with_no_live_worker_of_its_version_a_task_is_held_then_published_when_one_comes(
        store: Store) -> None:
    now = time.time()
    worker(store, "v2", now)
    worker(store, "v1", now - 100)        # stale: no heartbeat for three intervals
    engine, sent, run_id = started_first(store, pair(), now)
    assert sent.task_ids() == []
    held = second(store, run_id)
    assert (held["state"], held["published_at"], held["waiting_for"]) == ("queued", None, "v1")
    engine.tick(now + 1)                  # not due again yet: nothing changes
    assert sent.task_ids() == []
    engine.tick(now + 3)                  # looked at again: still none
    assert sent.task_ids() == [] and second(store, run_id)["waiting_for"] == "v1"
    worker(store, "v1", now + 4)
    engine.tick(now + 6)
    assert sent.pop("second").message.queue == "default@v1"
    published = second(store, run_id)      # it names the version it was sent to now
    assert published["published_at"] is not None and published["waiting_for"] == "v1"


def test_policy_newest_publishes_to_any_worker_after_the_timeout_and_wait_keeps_waiting(
        store: Store) -> None:
    now = time.time()
    worker(store, "v2", now)
    engine, sent, _ = started_first(store, pair("newest", timeout=5.0), now)
    engine.tick(now + 3)
    assert sent.task_ids() == []
    engine.tick(now + 6)
    assert sent.pop("second").message.queue == "default"
    engine, sent, run_id = started_first(store, pair("wait", timeout=5.0), now + 1)
    engine.tick(now + 30)
    assert sent.task_ids() == [] and second(store, run_id)["waiting_for"] == "v1"


def test_a_task_stranded_in_a_gone_versions_queue_is_sent_again_uncharged(
        store: Store) -> None:
    """`second` was sent to default@v1; every v1 worker goes (its RabbitMQ queue may expire
    with the message). At its deadline to start it is not failed (retries=0): the next
    attempt, uncharged, is held for v1, then (policy newest) sent to any worker. A v1 worker
    still alive at the deadline makes it an ordinary queued timeout."""
    now = time.time()
    worker(store, "v1", now)
    worker(store, "v2", now)
    dag = DAG("pair", pin_code=True, pin_timeout=30, pin_policy="newest", retries=0,
              queued_timeout=10)
    dag.command("first", ["true"]) >> dag.command("second", ["true"])
    engine, sent, run_id = started_first(store, dag, now)
    assert sent.pop("second").message.queue == "default@v1"
    worker(store, "v1", now - 100)        # the last v1 worker is gone (stale)
    engine.tick(now + 16)                 # past queued_timeout + start grace
    again = second(store, run_id)
    assert (again["state"], again["attempt"], again["max_attempts"], again["waiting_for"],
            again["published_at"]) == ("queued", 2, 2, "v1", None)   # held for v1
    attempts = store.rows("ti_attempts", ti_id=again["ti_id"])
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "stranded")]
    assert "default@v1, whose workers (code version v1) are all gone" in attempts[0]["error"]
    engine.tick(now + 31)                 # pin_timeout since it was first queued: newest
    assert sent.pop("second").message.queue == "default"

    worker(store, "v1", now + 40)         # a v1 worker lives: an ordinary queued timeout
    engine2, sent2, run2 = started_first(store, dag, now + 40)
    assert sent2.pop("second").message.queue == "default@v1"
    worker(store, "v1", now + 55)
    engine2.tick(now + 56)
    timed_out = second(store, run2)
    assert (timed_out["state"], timed_out["attempt"]) == ("failed", 1)


def test_status_and_the_sampler_see_the_queues_of_each_version(store: Store) -> None:
    """Each worker's `<queue>@<version>` and the one a pinned task went to are sampled and
    shown by `conveyor status`: a backlog left for an old version is visible."""
    now = time.time()
    worker(store, "v1", now)
    _, sent, run_id = started_first(store, pair(), now)
    assert sent.pop("second").message.queue == "default@v1"
    with store.transaction():
        Workers(store).delete("w-v1")     # the v1 worker left the registry
    worker(store, "v2", now, queues="default,heavy")
    assert queues_to_sample(store, ("default",)) == [
        "default", "heavy", "default@v2", "heavy@v2", "default@v1"]
    shown = collect(store, None, [], 5, now)
    assert "default@v1" in [q["queue"] for q in shown["queues"]]


def test_a_cleared_task_runs_on_its_runs_version_unless_moved_to_the_latest(
        store: Store) -> None:
    """As a cleared Airflow 3 task runs its run's DAG version: `tasks clear` keeps the
    run's code version; `--latest-code` moves it to the newest live worker's."""
    now = time.time()
    worker(store, "v1", now)
    engine, sent, run_id = started_first(store, pair(), now)
    engine.handle(event(sent.pop("second"), "succeeded", now), now)
    assert store.one("run", run_id=run_id)["state"] == "success"
    with store.transaction():
        Workers(store).beat(worker_id="w-v2", hostname="host-v2", pid=2, queues="default",
                            concurrency=1, interval=10.0, started_at=now + 5, busy=0,
                            now=now + 5, runners=None, code_version="v2")
    assert clear(store, run_id, "second", now + 6) == ["second"]
    engine.tick(now + 6)
    again = sent.pop("second")
    assert again.message.queue == "default@v1"      # kept
    engine.handle(event(again, "succeeded", now + 7), now + 7)
    clear(store, run_id, "second", now + 8, latest_code=True)
    assert store.one("run", run_id=run_id)["code_version"] == "v2"
    engine.tick(now + 8)
    assert sent.pop("second").message.queue == "default@v2"      # moved on


def test_latest_code_from_the_cli_and_the_dashboard_moves_the_cleared_run(
        store: Store, state_url: str, tmp_path: Path) -> None:
    """`conveyor tasks clear --latest-code` and the dashboard's {"latest_code": true} move
    the run to the newest live worker's version; a plain clear from either keeps it."""
    now = time.time()
    worker(store, "v1", now)
    engine, sent, run_id = started_first(store, pair(), now)
    engine.handle(event(sent.pop("second"), "succeeded", now), now)
    worker(store, "v2", now + 1)
    flags = [f"--state={state_url}", f"--broker=sqlite:///{tmp_path}/broker.db"]
    assert cli.main(["tasks", "clear", run_id, "second", *flags]) == 0
    assert store.one("run", run_id=run_id)["code_version"] == "v1"
    engine.tick(time.time())
    engine.handle(event(sent.pop("second"), "succeeded", time.time()), time.time())
    assert cli.main(["tasks", "clear", run_id, "second", "--latest-code", *flags]) == 0
    assert store.one("run", run_id=run_id)["code_version"] == "v2"
    engine.tick(time.time())
    moved = sent.pop("second")
    assert moved.message.queue == "default@v2"
    engine.handle(event(moved, "succeeded", time.time()), time.time())
    worker(store, "v3", now + 2)
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url)
    dashboard = Dashboard(UiConfig(config, "s3cret"))
    try:
        for latest, expected in ((False, "v2"), (True, "v3")):
            response = dashboard.handle(Request(
                "POST", f"/api/runs/{run_id}/tasks/second/clear",
                headers={"host": "127.0.0.1:8700", "content-type": "application/json",
                         "x-conveyor-token": "s3cret"},
                body=json.dumps({"latest_code": latest}).encode()))
            assert response.status == 200, response.body
            assert store.one("run", run_id=run_id)["code_version"] == expected
    finally:
        dashboard.close()


def test_a_dag_refuses_an_unknown_pin_policy_or_a_negative_timeout() -> None:
    with pytest.raises(DagError, match="pin_policy must be 'wait' or 'newest'"):
        DAG("bad", pin_code=True, pin_policy="oldest")
    with pytest.raises(DagError, match="pin_timeout"):
        DAG("bad", pin_code=True, pin_timeout=-1)


@pytest.fixture
def ui(store: Store, tmp_path: Path, state_url: str) -> Iterator[Dashboard]:
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url)
    dashboard = Dashboard(UiConfig(config, ""))
    yield dashboard
    dashboard.close()


def test_the_dashboard_shows_versions_the_wait_and_the_dag_source(
        ui: Dashboard, store: Store, tmp_path: Path) -> None:
    now = time.time()
    worker(store, "v2", now)
    dag = pair()
    dag.version, dag.source, dag.file = "abc123", "# the DAG as it was\n", "/dags/pair.py"
    _, _, run_id = started_first(store, dag, now)
    page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
    assert "<code>v1</code>, pinned" in page
    assert "waiting for a worker of code version v1" in page
    assert "# the DAG as it was" in page and "/dags/pair.py" in page
    api = json.loads(ui.handle(Request("GET", f"/api/runs/{run_id}")).body)
    assert api["code"]["waiting"] == {"second": "waiting for a worker of code version v1"}
    assert "code_version" in api["waiting"]["second"][0]["reason"]
    workers = ui.handle(Request("GET", "/workers")).body.decode()
    assert "code version" in workers and "<code>v2</code>" in workers


def test_a_task_held_by_a_dead_scheduler_is_published_once_by_another(store: Store) -> None:
    """The holder keeps no lease (killed): another scheduler takes the hold over at its
    recheck and publishes it; the first, were it back, finds nothing left to publish."""
    now = time.time()
    holder, held_by, run_id = started_first(store, pair(), now)
    assert held_by.task_ids() == [] and second(store, run_id)["waiting_for"] == "v1"
    worker(store, "v1", now + 1)
    other = RecordingExecutor()
    Engine(store, {"queue": other}, dags={"pair": pair()}).tick(now + 3)
    assert other.pop("second").message.queue == "default@v1"
    holder.tick(now + 10)
    assert held_by.task_ids() == [] and other.task_ids() == []
