"""The worker registry: heartbeat rows in the state store, stale ones told apart."""

from __future__ import annotations

from pathlib import Path

from conveyor.locations import store_urls
from conveyor.state import store as stores
from conveyor.state.monitoring import Workers
from conveyor.worker.registry import Registry


def test_beats_upsert_one_row_and_close_deletes_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    clock = iter([100.0, 101.0, 130.0]).__next__
    registry = Registry(url, "box-1", ("default", "heavy"), 4, 10.0, clock=clock)
    registry.beat(1)
    registry.beat(3)
    store = stores.from_url(url)
    try:
        [record] = Workers(store).all()
        assert (record.hostname, record.queues, record.busy, record.free) == (
            "box-1", "default,heavy", 3, 1)
        assert not record.stale(160.0) and record.stale(160.5)
        registry.close()
        assert Workers(store).all() == []
    finally:
        store.close()


def test_a_beat_carries_what_each_runner_slot_holds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    registry = Registry(url, "box-1", ("default",), 2, 10.0, clock=lambda: 100.0)
    runners = {"limiter": "cgroup2", "slots": [
        {"slot": 0, "task": "t.hold", "memory": 50 << 20, "limit": 256 << 20, "seconds": 1.5},
        {"slot": 1, "task": None, "memory": 3 << 20}]}
    registry.beat(1, runners)
    store = stores.from_url(url)
    try:
        [record] = Workers(store).all()
        assert record.runners == runners
        registry.beat(0)          # a beat without runners (they could not be read)
        assert Workers(store).all()[0].runners is None
    finally:
        registry.close()
        store.close()


def test_an_unreachable_store_never_raises(tmp_path: Path) -> None:
    registry = Registry("postgresql://nobody@127.0.0.1:1/none", "box", ("q",), 1, 1.0)
    registry.beat(0)
    registry.beat(0)
    assert registry._store.failing


def test_where_a_worker_registers() -> None:
    assert str(store_urls("", "").registry).endswith("scheduler.db")
    assert store_urls("redis://r", "postgresql://p/db").registry == "postgresql://p/db"
    assert store_urls("redis://r", "").registry is None
