"""AssetTrigger on an SQLite state store, served as a triggerer serves it (one poller, the
store on one thread of its own); tests/integration/test_triggerer.py runs it end to end on
SQLite and Postgres with `conveyor assets touch`."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conveyor.state.assets import record_event
from conveyor.state.store import Store
from conveyor.triggerer.assets import AssetWatch
from conveyor.triggers import AssetTrigger, TriggerError, load
from conveyor.triggers.assets import ASSET_EVENTS
from tests.support import run_coroutine


class Orders:
    """Stands for an `Asset`: what AssetTrigger reads of one is its `uri`."""

    uri = "s3://lake/orders"


async def serve(store: Store, *triggers: AssetTrigger, record: Any = (),
                late: Any = ()) -> list[Any]:
    """Run `triggers` under an AssetWatch; `record(store)` on the store's thread once
    they wait, then `late(store)` once it has been read; their payloads."""
    io = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()

    async def call(fn: Any) -> Any:
        return await loop.run_in_executor(io, fn)

    try:
        ASSET_EVENTS.set(AssetWatch(store, call))
        running = [asyncio.create_task(t.run()) for t in triggers]
        await asyncio.sleep(0.3)   # they wait (or have fired)
        for step in (record, late):
            if step:
                await call(functools.partial(step, store))
                await asyncio.sleep(0.3)   # read
        return list(await asyncio.wait_for(asyncio.gather(*running), 30))
    finally:
        io.shutdown()


def touch(store: Store, uri: str, n: int) -> int:
    return record_event(store, uri, {"n": n}, time.time(), source="cli")[0]


def test_it_fires_on_the_first_event_after_it_deferred_with_the_event(store: Store) -> None:
    touch(store, Orders.uri, 0)   # before: not this trigger's
    classpath, kwargs = AssetTrigger(Orders, poll_interval=0.05).serialize()   # type: ignore[arg-type]
    trigger = load(classpath, kwargs)
    assert isinstance(trigger, AssetTrigger) and trigger.uri == Orders.uri and trigger.since
    other = AssetTrigger("s3://lake/items", poll_interval=0.05, since=trigger.since)
    ids: list[int] = []

    def record(s: Store) -> None:
        ids.extend([touch(s, "s3://lake/elsewhere", 9), touch(s, Orders.uri, 1),
                    touch(s, "s3://lake/items", 2), touch(s, Orders.uri, 3)])

    fired = run_coroutine(serve(store, trigger, other, record=record))
    assert fired[0] == {"event_id": ids[1], "uri": Orders.uri, "extra": {"n": 1},
                        "timestamp": pytest.approx(time.time(), abs=60), "source": "cli"}
    assert fired[1]["event_id"] == ids[2] and fired[1]["extra"] == {"n": 2}


def test_an_event_between_its_deferral_and_its_claim_fires_it(store: Store) -> None:
    """Taken over from a killed triggerer, or claimed late: it looks back to `since`."""
    trigger = AssetTrigger(Orders.uri, poll_interval=0.05, since=time.time() - 1)
    event_id = touch(store, Orders.uri, 5)
    fired = run_coroutine(serve(store, trigger))
    assert fired[0]["event_id"] == event_id and fired[0]["extra"] == {"n": 5}


def test_outside_a_triggerer_it_says_where_it_runs() -> None:
    with pytest.raises(TriggerError, match="conveyor triggerer"):
        run_coroutine(AssetTrigger(Orders.uri).run())


def test_an_event_committed_below_the_cursor_still_fires_it(store: Store, tmp_path: Path
                                                           ) -> None:
    """Postgres takes an event's id at insert: a slow transaction commits an id the cursor
    has passed. Here id 3 is committed after 4 was read."""
    trigger = AssetTrigger(Orders.uri, poll_interval=0.05, since=time.time() - 1)

    def insert(event_id: int, uri: str, extra: str) -> None:
        with sqlite3.connect(tmp_path / "state.db") as db:
            db.execute("INSERT INTO conveyor_asset_events (event_id, uri, extra, source, "
                       "created_at) VALUES (?, ?, ?, 'cli', ?)",
                       (event_id, uri, extra, time.time()))

    def record(s: Store) -> None:   # ids 2 and 3 taken, not committed
        insert(1, "s3://lake/elsewhere", "{}")
        insert(4, "s3://lake/elsewhere", "{}")

    fired = run_coroutine(serve(store, trigger, record=record,
                              late=lambda s: insert(3, Orders.uri, '{"n": 7}')))
    assert fired[0]["event_id"] == 3 and fired[0]["extra"] == {"n": 7}
