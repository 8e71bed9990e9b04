"""Events applied in batches and children published in batches: one transaction per run
for many events, one publish for many children, and a failure that stays with the one
event or message it belongs to."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from conveyor import broker as brokers
from conveyor.client import Client
from conveyor.events import Event
from conveyor.message import Codec
from conveyor.scheduler import DAG
from conveyor.scheduler.daemon import MAX_EVENT_DELIVERIES, Daemon
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.event_facts import by_run
from conveyor.scheduler.executors.queue import QueueExecutor
from conveyor.scheduler.runs import create_run
from conveyor.state.records import TaskInstance
from conveyor.state.store import Store
from tests.support import RecordingExecutor, event, wait_for

T0 = 1_700_000_000.0


def fan(width: int, queue: str = "default") -> DAG:
    """A root with `width` children."""
    dag = DAG("fan", queue=queue, retries=0)
    root = dag.command("root", ["true"])
    root >> [dag.command(f"c{i}", ["true"]) for i in range(width)]
    dag.validate(["queue"])
    return dag


def count_transactions(store: Store) -> list[int]:
    """A one-element list that counts the outermost transactions `store` begins."""
    begun = [0]
    begin = store._begin

    def counting() -> None:
        begun[0] += 1
        begin()

    store._begin = counting  # type: ignore[method-assign]
    return begun


def states(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=run_id)}


def test_events_of_two_runs_take_one_transaction_per_run_and_keep_their_order(
        store: Store) -> None:
    dag = fan(3)
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"fan": dag})
    runs = [create_run(store, dag, T0 + i, executors=["queue"]) for i in range(2)]
    engine.tick(T0)
    roots = [executor.pop("root"), executor.pop("root")]
    # interleaved, and each run's `succeeded` before its `started` is out of order on purpose
    batch = [event(roots[0], "started", T0 + 1), event(roots[1], "succeeded", T0 + 2),
             event(roots[0], "succeeded", T0 + 2), event(roots[1], "started", T0 + 1)]
    assert [[e.headers["run"] for e in g] for g in by_run(batch)] == [
        [runs[0], runs[0]], [runs[1], runs[1]]]
    begun = count_transactions(store)
    engine.handle_many(batch, T0 + 3)
    # one per run for the events, one per run recording its children's publish
    assert begun[0] == 4
    for run_id in runs:
        assert states(store, run_id) == {"root": "success", "c0": "queued", "c1": "queued",
                                         "c2": "queued"}
        root = store.one("run_ti_by_task", run_id=run_id, task_id="root")
        assert root is not None and root["started_at"] == T0 + 1   # the late start filled in
    assert sorted(executor.task_ids()) == ["c0", "c0", "c1", "c1", "c2", "c2"]


def test_a_message_over_the_size_cap_fails_its_task_and_the_others_of_the_batch_go(
        store: Store, tmp_path: Path) -> None:
    dag = DAG("fan", retries=0)
    dag.command("small", ["true"])
    dag.command("large", ["echo", "x" * 4000])
    broker = brokers.from_url(f"sqlite:///{tmp_path}/broker.db")
    executor = QueueExecutor(Client(broker, Codec(max_bytes=2000)))
    engine = Engine(store, {"queue": executor}, dags={"fan": dag})
    try:
        run_id = create_run(store, dag, T0, executors=["queue"])
        assert run_id is not None
        engine.tick(T0)
        assert states(store, run_id) == {"small": "queued", "large": "failed"}
        large = store.one("run_ti_by_task", run_id=run_id, task_id="large")
        assert large is not None and "over the 2000-byte cap" in large["error"]
        assert broker.depth("default").ready == 1
    finally:
        executor.close()


class FailsOn(Engine):
    """An engine that cannot apply events of one kind (a bug, a constraint it trips on)."""

    poison = "heartbeat"

    def _apply_event(self, event: Event, ref: tuple[str, int] | None,
                     tis: Mapping[str, TaskInstance], now: float) -> list[TaskInstance]:
        if event.kind == self.poison:
            raise RuntimeError(f"cannot apply {event.kind}")
        return super()._apply_event(event, ref, tis, now)


def test_an_event_that_fails_in_a_batch_is_retried_alone_then_set_aside(
        store: Store, tmp_path: Path) -> None:
    """The batch fails, so each event is applied alone: the good ones (even the one after
    the bad one) are applied and acked, the scheduler stops, and the bad one comes back when
    its lease lapses, until its fifth delivery sets it aside and the run carries on."""
    NOW = time.time()   # the daemon reads the clock: a time of this test, not of its import
    dag = fan(2)
    recorder = RecordingExecutor()
    engine = FailsOn(store, {"queue": recorder}, dags={"fan": dag}, events_queue="events")
    run_id = create_run(store, dag, NOW, executors=["queue"])
    engine.tick(NOW)
    root = recorder.pop("root")
    broker = brokers.from_url(f"sqlite:///{tmp_path}/broker.db", lease_seconds=0.2)
    try:
        for kind in ("started", "heartbeat", "succeeded"):
            broker.publish("events", event(root, kind, NOW + 1).encode())
        daemon = Daemon(engine, broker, {"queue": recorder}, events_queue="events",
                        control_queue="control")
        with pytest.raises(RuntimeError, match="cannot apply heartbeat"):
            daemon.run(burst=True)
        assert states(store, run_id)["root"] == "success"
        assert sorted(recorder.task_ids()) == ["c0", "c1"]
        assert broker.depth("events").in_flight == 1       # only the heartbeat is left
        for _ in range(MAX_EVENT_DELIVERIES - 2):
            with pytest.raises(RuntimeError):
                daemon.run(burst=True)
        fifth = threading.Thread(target=daemon.run, kwargs={"burst": True})
        fifth.start()                                        # fifth delivery: set aside
        with brokers.from_url(f"sqlite:///{tmp_path}/broker.db") as mine:  # not the daemon's
            dead = wait_for(lambda: mine.dead_letters("events"), what="a dead letter")
            assert "failed to apply this event 5 times" in dead[0].reason
            for work in recorder.sent:                       # and the run goes on
                mine.publish("events", event(work, "succeeded", NOW + 2).encode())
        fifth.join(30)
        assert not fifth.is_alive()
        assert store.one("run", run_id=run_id)["state"] == "success"
    finally:
        daemon.waker.close()
        broker.close()


def test_a_scheduler_that_fell_behind_applies_what_piled_up_in_few_transactions(
        store: Store, tmp_path: Path) -> None:
    NOW = time.time()   # the daemon reads the clock: a time of this test, not of its import
    dag = fan(40)
    recorder = RecordingExecutor()
    engine = Engine(store, {"queue": recorder}, dags={"fan": dag}, events_queue="events")
    run_id = create_run(store, dag, NOW, executors=["queue"])
    engine.tick(NOW)
    engine.handle(event(recorder.pop("root"), "succeeded", NOW + 1), NOW + 1)
    broker = brokers.from_url(f"sqlite:///{tmp_path}/broker.db")
    daemon = Daemon(engine, broker, {"queue": recorder}, events_queue="events",
                    control_queue="control")
    batches: list[int] = []
    handle_many = engine.handle_many

    def recording(events: list[Event], now: float) -> None:
        batches.append(len(events))
        handle_many(events, now)

    engine.handle_many = recording  # type: ignore[method-assign]
    try:
        for work in recorder.sent:
            for kind in ("started", "succeeded"):
                broker.publish("events", event(work, kind, NOW + 2).encode())
        daemon.run(burst=True)
        assert store.one("run", run_id=run_id)["state"] == "success"
        assert broker.depth("events").active == 0
        assert batches == [64, 16]          # as many as a claim holds (PREFETCH), then the rest
    finally:
        daemon.close()


def test_a_run_created_before_specs_listed_children_still_dispatches_them(
        store: Store) -> None:
    """A run's spec now lists each task's children (a leaf's success then looks for none);
    a run created by an older scheduler has no such list and is looked up as before."""
    dag = fan(2)
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"fan": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    specs = {r["task_id"]: r["spec"] for r in store.rows("run_tis", run_id=run_id)}
    assert '"downstream": ["c0", "c1"]' in specs["root"] and '"downstream": []' in specs["c0"]
    store._execute("UPDATE conveyor_task_instances SET spec = json_remove(spec, '$.downstream')",
                   {})
    engine.tick(T0)
    engine.handle(event(executor.pop("root"), "succeeded", T0 + 1), T0 + 1)
    assert sorted(executor.task_ids()) == ["c0", "c1"]
    for task_id in ("c0", "c1"):
        engine.handle(event(executor.pop(task_id), "succeeded", T0 + 2), T0 + 2)
    assert store.one("run", run_id=run_id)["state"] == "success"


def test_a_batch_whose_leases_lapsed_is_applied_and_the_lapse_only_logged(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """While the batch was applied its leases lapsed and another consumer claimed the
    events (fabricated: their lease token changed): the acks fail, which is only logged,
    since applying them again elsewhere changes nothing."""
    NOW = time.time()   # the daemon reads the clock: a time of this test, not of its import
    dag = fan(2)
    recorder = RecordingExecutor()

    class Stolen(Engine):
        """Its first batch's leases are taken while it applies them; then the children's
        outcomes arrive, so the run can end."""

        sizes: list[int] = []

        def handle_many(self, events: Sequence[Event], now: float) -> None:
            self.sizes.append(len(events))
            super().handle_many(events, now)
            if events[0].headers["task_id"] == "root":
                with sqlite3.connect(tmp_path / "broker.db") as db:
                    db.execute("UPDATE conveyor_messages SET lease = 'someone else'")
                for work in recorder.sent:
                    broker.publish("events", event(work, "succeeded", NOW + 2).encode())

    caplog.set_level(logging.INFO, logger="conveyor.scheduler")
    engine = Stolen(store, {"queue": recorder}, dags={"fan": dag}, events_queue="events")
    run_id = create_run(store, dag, NOW, executors=["queue"])
    engine.tick(NOW)
    root = recorder.pop("root")
    broker = brokers.from_url(f"sqlite:///{tmp_path}/broker.db")
    daemon = Daemon(engine, broker, {"queue": recorder}, events_queue="events",
                    control_queue="control")
    try:
        for kind in ("started", "succeeded"):
            broker.publish("events", event(root, kind, NOW + 1).encode())
        daemon.run(burst=True)
        assert store.one("run", run_id=run_id)["state"] == "success"
        lapsed = [r for r in caplog.records if "applied after its lease lapsed" in r.message]
        assert len(lapsed) == 2 and Stolen.sizes[0] == 2      # both acks of one batch
    finally:
        daemon.close()
