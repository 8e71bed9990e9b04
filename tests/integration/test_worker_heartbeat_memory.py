"""A real worker's heartbeat row counts the tasks it finished per queue and shows each runner
slot: its task, and the memory charged to its lane against the task's cap (what the
dashboard's Queues and Workers pages draw), on SQLite and Postgres state stores."""

from __future__ import annotations

from pathlib import Path

from conveyor.state import store as stores
from conveyor.state.monitoring import Workers
from conveyor.state.records import WorkerRecord
from tests.integration.workerkit import (
    enqueue,
    finish,
    open_broker,
    start_worker,
    stop_cold,
    task_message,
    worker_env,
)
from tests.support import wait_for

MiB = 1024 * 1024


def test_the_heartbeat_shows_a_runners_memory_against_its_cap(tmp_path: Path, unique: str,
                                                              state_url: str) -> None:
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    broker = open_broker(broker_url)
    store = stores.from_url(state_url)
    worker = start_worker(broker_url, unique, "--concurrency=2", "--memory-limit=256MiB",
                          f"--state={state_url}", burst=False,
                          env=worker_env(broker_url, CONVEYOR_STATE_URL=state_url))
    try:
        enqueue(broker, task_message("t.add", unique, 1, 2))
        enqueue(broker, task_message("t.fail", unique))     # fails, is retried, fails again

        def counted() -> bool:
            return any((w.runners or {}).get("finished", {}).get(unique) == [1, 2]
                       for w in Workers(store).all())

        wait_for(counted, 60, "a heartbeat counting 1 succeeded and 2 failed tasks")
        enqueue(broker, task_message("t.hold", unique, 48, 30.0))

        def holding() -> WorkerRecord | None:
            for record in Workers(store).all():
                slots = (record.runners or {}).get("slots", [])
                if any(s["task"] == "t.hold" and (s["memory"] or 0) >= 48 * MiB
                       for s in slots):
                    return record
            return None

        record = wait_for(holding, 60, "a heartbeat showing t.hold's 48 MiB")
        busy = next(s for s in record.runners["slots"] if s["task"])
        idle = next(s for s in record.runners["slots"] if not s["task"])
        assert busy["limit"] == 256 * MiB and busy["queue"] == unique and busy["seconds"] >= 0
        assert busy["memory"] < 256 * MiB
        if record.runners["limiter"] != "rlimit":   # the fallback reads a runner, not a lane
            assert idle["memory"] is not None and idle["memory"] < 48 * MiB
        assert record.runners["limiter"] in ("cgroup1", "cgroup2", "rlimit")
        assert record.busy == 1 and record.free == 1
    finally:
        stop_cold(worker)   # the held task is not waited for
        finish(worker)
        broker.close()
    assert Workers(store).all() == []   # a clean stop removes the row
    store.close()
