"""Why a queued task waits, on the run and task pages and their JSON: queued since when, no
worker consuming its queue (from the worker registry), a full limit (from the limiter the
workers use), nothing publishing it; over SQLite and Postgres state."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import limits
from conveyor.flow import Limit, Spec, encode
from conveyor.limits import Parcel, Usage
from conveyor.readers.limits import NO_SCHEDULER, why_queued
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.lease import SchedulerLease
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.html import ago
from conveyor.ui.http import Request
from conveyor.worker.registry import Registry
from tests.support import RecordingExecutor, event

ACME = Spec("c", "tenant:acme", max=1)


@pytest.fixture
def ui(store: Store, tmp_path: Path, state_url: str) -> Iterator[Dashboard]:
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url)
    dashboard = Dashboard(UiConfig(config, ""))
    yield dashboard
    dashboard.close()


def queued_run(store: Store) -> str:
    dag = DAG("stuck")
    dag.command("sync", ["true"], queue="b1_nowhere",
                concurrency=(Limit("tenant:acme", max=1),))
    dag.validate()
    run_id = create_run(store, dag, time.time() - 300, executors=["queue"])
    assert run_id is not None
    Engine(store, {"queue": RecordingExecutor()}, dags={"stuck": dag}).tick(time.time())
    return run_id


def get(ui: Dashboard, path: str) -> Any:
    body = ui.handle(Request("GET", path)).body.decode()
    return json.loads(body) if path.startswith("/api/") else body


def test_a_queued_task_says_no_worker_consumes_its_queue_and_which_limit_is_full(
        ui: Dashboard, store: Store, state_url: str) -> None:
    run_id = queued_run(store)
    s = ui.config.scheduler.settings
    limiter = limits.from_url(s.stores().limits)
    try:
        for i in range(3):     # one holds the only token, two wait
            limiter.admit(Parcel(f"m{i}", "b1_nowhere", b"{}"), [ACME], time.time(), 60.0)
        doc = get(ui, f"/api/runs/{run_id}/tasks/sync")
        assert [w["text"] for w in doc["waiting"]] == [
            "no worker consumes queue `b1_nowhere`: start one with `conveyor worker --queues "
            "b1_nowhere` (only workers given a state store are seen here)",
            "waiting for limit `tenant:acme` (1 of 1 in use, 2 waiting)", NO_SCHEDULER]
        assert get(ui, f"/api/runs/{run_id}")["waiting"]["sync"] == doc["waiting"]
        page = get(ui, f"/runs/{run_id}/tasks/sync")
        assert "queued <time" in page and "data-since=" in page
        assert "no worker consumes queue <code>b1_nowhere</code>" in page
        assert "waiting for limit <code>tenant:acme</code> (1 of 1 in use, 2 waiting)" in page
        run_page = get(ui, f"/runs/{run_id}")
        assert '<ul class="why"><li class="why-no_consumer">' in run_page

        registry = Registry(state_url, "box", ("b1_nowhere",), 1, 5.0)
        try:
            registry.beat(0, None)
            doc = get(ui, f"/api/runs/{run_id}/tasks/sync")
            assert [w["reason"] for w in doc["waiting"]] == ["limit", "no_scheduler"]
        finally:
            registry.close()
        limiter.release("m0", [ACME], time.time(), 60.0)   # m1 gets it; m2 still waits
        limiter.release("m1", [ACME], time.time(), 60.0)
        limiter.release("m2", [ACME], time.time(), 60.0)
        doc = get(ui, f"/api/runs/{run_id}/tasks/sync")
        assert [w["reason"] for w in doc["waiting"]] == ["no_consumer", "no_scheduler"]
    finally:
        limiter.close()


def test_an_unreadable_limits_store_leaves_the_limit_out_not_the_page(
        store: Store, tmp_path: Path, state_url: str) -> None:
    run_id = queued_run(store)
    config = SchedulerConfig.from_env({"CONVEYOR_LIMITS_URL": "redis://127.0.0.1:1/0"},
                                      broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url)
    ui = Dashboard(UiConfig(config, ""))
    assert ui.config.scheduler.settings.limits_url == "redis://127.0.0.1:1/0"
    try:
        doc = get(ui, f"/api/runs/{run_id}/tasks/sync")
        assert [w["reason"] for w in doc["waiting"]] == ["no_consumer", "no_scheduler"]
    finally:
        ui.close()


def test_why_queued_says_nothing_publishes_a_task_that_waits_unpublished() -> None:
    now = time.time()
    ti = {"state": "queued", "queue": "q", "queued_at": now - 45, "published_at": None,
          "spec": {"limits": encode([ACME])}}
    why = why_queued(ti, now, {"q": [{"worker": "w"}]}, {})
    assert [w["reason"] for w in why] == ["unpublished"]
    assert "is a scheduler running" in why[0]["text"]
    assert "no scheduler is running against this state store (none holds a lease)" in \
        why_queued(ti, now, {"q": [{}]}, {}, schedulers=0)[0]["text"]
    assert "although 2 scheduler(s) run: see their log" in \
        why_queued(ti, now, {"q": [{}]}, {}, schedulers=2)[0]["text"]
    assert why_queued({**ti, "queued_at": now - 5}, now, {"q": [{}]}, None) == []
    full = {"tenant:acme": Usage("tenant:acme", 1, 0, 0, max=1)}
    assert why_queued({**ti, "published_at": now}, now, {"q": [{}]}, full)[0]["text"] == \
        "waiting for limit `tenant:acme` (1 of 1 in use, 0 waiting)"
    assert why_queued({**ti, "state": "running"}, now, {}, full) == []


def test_a_published_task_with_no_scheduler_says_none_applies_what_workers_report(
        ui: Dashboard, store: Store, state_url: str) -> None:
    """A worker may have run it already: its outcome waits for a scheduler, and starting
    a worker (what no_consumer alone would suggest) changes nothing."""
    run_id = queued_run(store)
    registry = Registry(state_url, "box", ("b1_nowhere",), 1, 5.0)
    try:
        registry.beat(0, None)
        doc = get(ui, f"/api/runs/{run_id}/tasks/sync")
        assert [w["text"] for w in doc["waiting"]] == [NO_SCHEDULER]
        assert "start `conveyor scheduler`" in NO_SCHEDULER
        assert '<li class="why-no_scheduler">' in get(ui, f"/runs/{run_id}/tasks/sync")
        lease = SchedulerLease(state_url, "s1", 30.0)
        lease.renew()                   # a scheduler runs: it will apply what workers report
        try:
            assert get(ui, f"/api/runs/{run_id}/tasks/sync")["waiting"] == []
        finally:
            lease.close()
    finally:
        registry.close()
    now = time.time()
    ti = {"state": "queued", "queue": "q", "queued_at": now - 45, "published_at": now - 40,
          "spec": {}}
    assert why_queued(ti, now, {"q": [{}]}, {}, schedulers=0) == [
        {"reason": "no_scheduler", "text": NO_SCHEDULER}]
    assert why_queued(ti, now, {"q": [{}]}, {}, schedulers=None) == []   # not known
    assert [w["reason"] for w in why_queued({**ti, "published_at": None}, now, {"q": [{}]},
                                           {}, schedulers=0)] == ["unpublished"]


def test_a_running_task_says_when_no_heartbeat_came_for_long_and_no_scheduler_runs(
        ui: Dashboard, store: Store, state_url: str) -> None:
    """A worker killed while no scheduler runs: the task reads running for ever; the page
    says what holds it (and what to start)."""
    dag = DAG("zombie")
    dag.command("sync", ["true"])
    dag.validate()
    started = time.time() - 600
    run_id = create_run(store, dag, started, executors=["queue"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"zombie": dag})
    engine.tick(started)
    engine.handle(event(executor.sent[0], "started", started), started)
    assert get(ui, f"/api/runs/{run_id}/tasks/sync")["task"]["state"] == "running"
    why = get(ui, f"/api/runs/{run_id}/tasks/sync")["waiting"]
    assert [w["reason"] for w in why] == ["silent", "no_scheduler"]
    assert why[0]["text"] == ("no heartbeat recorded for 10 min: its worker may have been "
                              "killed, frozen or cut off from the broker (see Workers)")
    assert get(ui, f"/api/runs/{run_id}")["waiting"]["sync"] == why
    assert '<li class="why-silent">' in get(ui, f"/runs/{run_id}")
    assert '<a href="/workers">Workers</a>' in get(ui, f"/runs/{run_id}/tasks/sync")
    lease = SchedulerLease(state_url, "s1", 30.0)
    lease.renew()
    try:
        why = get(ui, f"/api/runs/{run_id}/tasks/sync")["waiting"]
        assert [w["reason"] for w in why] == ["silent"]
        assert why[0]["text"].endswith("; a scheduler times it out 5 min after its last one "
                                       "and retries it while its retries last")
        now = time.time()
        engine.handle(event(executor.sent[0], "heartbeat", now), now)
        assert get(ui, f"/api/runs/{run_id}/tasks/sync")["waiting"] == []
    finally:
        lease.close()


@pytest.mark.parametrize(("elapsed", "said"), [(0, "0 s"), (59.9, "59 s"), (61, "1 min"),
                                               (3725, "1 h 2 min"), (90000, "1 d 1 h")])
def test_ages_read_as_people_say_them(elapsed: float, said: str) -> None:
    assert ago(elapsed) == said


def test_the_runs_and_run_pages_say_when_no_scheduler_moves_their_runs(
        ui: Dashboard, store: Store, state_url: str) -> None:
    run_id = queued_run(store)
    said = "No scheduler is running against this state store"
    assert said in get(ui, "/runs") and said in get(ui, f"/runs/{run_id}")
    lease = SchedulerLease(state_url, "s1", 30.0)
    lease.renew()
    try:
        assert said not in get(ui, "/runs") and said not in get(ui, f"/runs/{run_id}")
    finally:
        lease.close()
