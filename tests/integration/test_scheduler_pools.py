"""A DAG's pool end to end: the scheduler daemon and a real `conveyor worker`.

Airflow does not time out a task that waits for a pool slot (it stays `scheduled`); nor does
Conveyor: a task parked behind its full pool keeps no queued deadline until it is handed a
slot (worker events `parked`, `unparked`). Here the pool has one slot, the first task holds
it for 6 s and both have a queued_timeout of 3 s: the second waits twice its timeout, then
runs, and the run succeeds.

The DAG is triggered once the worker says it is consuming: a worker still starting when the
first task's deadline passes would (rightly) time both out, which is not what this tests
(seen under load with a 2 s queued_timeout and the worker spawned beside the trigger).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build
from conveyor.scheduler.runs import trigger
from tests.support import run_to_end, stop, wait_for


def test_a_task_waiting_for_its_pool_outlives_its_queued_timeout(tmp_path: Path,
                                                                  unique: str) -> None:
    broker_url, queue = f"sqlite:///{tmp_path}/broker.db", f"work-{unique}"
    dag = DAG("exports", pools={"warehouse": 1})
    for name in ("first", "second"):
        dag.command(name, ["sh", "-c", f"echo {name} $(date +%s.%N) >> {tmp_path}/ledger; "
                                       "sleep 6"], pool="warehouse", queued_timeout=3,
                    queue=queue)
    dag.validate(["queue"])
    config = SchedulerConfig.from_env(
        {}, broker_url=broker_url, state_url=f"sqlite:///{tmp_path}/state.db",
        events_queue=f"events-{unique}", control_queue=f"control-{unique}")
    daemon = build(config, {dag.dag_id: dag})
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "worker", "--queues",
                                   queue, "--concurrency", "2", "--broker", broker_url,
                                   "--log-level", "INFO"], stdout=out, stderr=out)
    try:
        wait_for(lambda: b" consuming " in log.read_bytes(), 60, "the worker to consume",
                 detail=lambda: log.read_text()[-2000:])
        run_id = trigger(daemon.engine.store, dag, 0.0, executors=["queue"])
        run_to_end(daemon, timeout=90)
        store = daemon.engine.store
        run = store.one("run", run_id=run_id)
        tasks = {t["task_id"]: (t["state"], t["attempt"])
                 for t in store.rows("run_tis", run_id=run_id)}
        attempts = [a["outcome"] for a in store.rows("run_attempts", run_id=run_id)]
    finally:
        daemon.close()
        stop(worker)
    assert tasks == {"first": ("success", 1), "second": ("success", 1)}, attempts
    assert run is not None and run["state"] == "success"
    starts = sorted(float(line.split()[1])
                    for line in (tmp_path / "ledger").read_text().splitlines())
    assert starts[1] - starts[0] >= 5.5  # one slot: the second waited for the first
