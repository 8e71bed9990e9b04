"""Several executors at once: the local executor runs tasks on the scheduler's host in the
worker's own isolated runner (a private `conveyor worker` child), the queue executor sends
the rest to real workers through the broker."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build, task_modules
from conveyor.scheduler.examples import revenue
from conveyor.scheduler.runs import trigger
from tests.support import run_to_end, spawn, stop

LOCAL = {"extract_orders", "clean_orders", "load_dashboard"}



def test_local_and_queue_executors_in_one_dag(tmp_path: Path, unique: str) -> None:
    ledger = tmp_path / "ledger"
    queue = f"work-{unique}"
    dag = revenue.build(ledger=str(ledger), seed=0, queue=queue)
    for task_id in LOCAL:
        node = dag.tasks[task_id]
        node.options = replace(node.options, executor="local")
    dag.validate(["queue", "local"])
    assert task_modules({"revenue": dag}, "local", "queue") == [
        "conveyor.scheduler.examples.revenue"]
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    config = SchedulerConfig.from_env({}, broker_url=broker_url,
                                      state_url=f"sqlite:///{tmp_path}/state.db",
                                      executors="queue,local", local_slots=2)
    daemon = build(config, {"revenue": dag})
    worker = spawn("worker", "--queues", queue, "--concurrency", "2", "--broker", broker_url,
                   "--app", "conveyor.scheduler.examples.revenue", "--log-level", "WARNING")
    try:
        run_id = trigger(daemon.engine.store, dag, 0.0, executors=config.executors)
        run_to_end(daemon)
        store = daemon.engine.store
        run = store.one("run", run_id=run_id)
        tasks = {t["task_id"]: t for t in store.rows("run_tis", run_id=run_id)}
    finally:
        daemon.close()
        stop(worker)

    assert run["state"] == "success", tasks
    assert {t: row["executor"] for t, row in tasks.items()} == {
        t: "local" if t in LOCAL else "queue" for t in revenue.TASKS}
    assert all(tasks[t]["hostname"].endswith("-local") for t in LOCAL)
    assert not any(tasks[t]["hostname"].endswith("-local") for t in set(revenue.TASKS) - LOCAL)
    assert tasks["extract_payments"]["attempt"] == 2
    assert revenue.ledger_counts(str(ledger))["load_dashboard"] == 1


def test_a_local_task_over_its_memory_cap_dies_alone(tmp_path: Path) -> None:
    dag = DAG("hog", executor="local")
    dag.command("hog", [sys.executable, "-c", "x = bytearray(300 * 2**20)"],
                memory_limit="64MiB")
    dag.command("fine", ["true"])
    dag.validate(["local"])
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=f"sqlite:///{tmp_path}/state.db",
                                      executors="local")
    daemon = build(config, {"hog": dag})
    try:
        run_id = trigger(daemon.engine.store, dag, 0.0, executors=config.executors)
        run_to_end(daemon)
        tasks = {t["task_id"]: t for t in daemon.engine.store.rows("run_tis", run_id=run_id)}
    finally:
        daemon.close()
    assert tasks["fine"]["state"] == "success"
    assert tasks["hog"]["state"] == "failed"
    assert "memory" in tasks["hog"]["error"].lower()   # oom_killed, or MemoryError under rlimit
