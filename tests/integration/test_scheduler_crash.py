"""`kill -9` of the scheduler mid-run, then a restart: the run resumes and nothing recorded
as succeeded runs again (the ledger counts every task's side effects)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from conveyor.scheduler import examples
from conveyor.scheduler.examples import revenue
from conveyor.state.store import from_url
from tests.support import conveyor, spawn, stop, wait_for

DAGS = str(Path(examples.__file__).parent / "dags")


def test_kill_9_mid_run_then_restart_reruns_nothing(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": f"sqlite:///{tmp_path}/state.db",
           "CONVEYOR_DAGS_FOLDER": DAGS, "CONVEYOR_REVENUE_LEDGER": str(ledger),
           "CONVEYOR_REVENUE_SEED": "21", "CONVEYOR_REVENUE_PAUSE": "1.5"}
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", "--app",
                   "conveyor.scheduler.examples.revenue", "--log-level", "WARNING", env=env)
    first = spawn("scheduler", "--log-level", "WARNING", env=env)
    second = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        run_id = conveyor("dags", "trigger", "revenue", "--json", env=env).stdout
        run_id = run_id.split('"run_id": "')[1].split('"')[0]

        def state(task_id: str) -> str:
            rows = store.rows("run_tis", run_id=run_id)
            return next(r["state"] for r in rows if r["task_id"] == task_id)

        wait_for(lambda: state("extract_orders") == "success" and
                 revenue.ledger_counts(str(ledger))["clean_orders"] == 1,
                 what="extract_orders to succeed and clean_orders to start")
        reported = store.one("run_ti_by_task", run_id=run_id, task_id="extract_orders")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert store.one("run", run_id=run_id)["state"] == "running"

        second = spawn("scheduler", "--burst", "--log-level", "WARNING", env=env)
        assert second.wait(60) == 0
        run = store.one("run", run_id=run_id)
        tasks = {r["task_id"]: (r["state"], r["attempt"]) for r in
                 store.rows("run_tis", run_id=run_id)}
        values = {r["task_id"]: json.loads(r["result"]) for r in
                  store.rows("run_tis", run_id=run_id)}
    finally:
        store.close()
        for proc in (first, second, worker):
            if proc is not None:
                stop(proc)

    assert run["state"] == "success", tasks
    assert tasks["extract_orders"] == ("success", 1)
    assert tasks["extract_payments"] == ("success", 3)
    # the value reported before the crash survived it, and fed the tasks run after it
    assert reported is not None and json.loads(reported["result"]) == values["extract_orders"]
    assert values["extract_orders"] == {"rows": 1200, "path": f"{tmp_path}/orders.csv"}
    assert values["aggregate_revenue"] == {"revenue": 51594.0, "orders": 1200,
                                           "payments": 1150}
    assert revenue.ledger_counts(str(ledger)) == {
        "extract_orders": 1, "extract_payments": 3, "clean_orders": 1, "clean_payments": 1,
        "aggregate_revenue": 1, "load_dashboard": 1}
