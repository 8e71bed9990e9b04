"""The revenue DAG end to end: the scheduler daemon, real `conveyor worker` processes, and
every broker transport that passes the conformance suite (tests/contract ENABLED).

extract_payments fails twice with a transient error (seed 21) and succeeds on its third
attempt; the run ends success, the attempts are recorded, and the ledger shows every task
ran exactly as often as its attempts say.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build
from conveyor.scheduler.examples import revenue
from conveyor.scheduler.runs import trigger
from tests.conftest import clean_transport, require_service
from tests.contract.conftest import ENABLED, TRANSPORTS
from tests.support import run_to_end, spawn, stop

SEED_FAILS_TWICE = 21


@pytest.fixture(params=ENABLED)
def broker_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    service, make_url = TRANSPORTS[request.param]
    if service:
        require_service(service)
    url = make_url(tmp_path, unique)
    yield url
    # delete, not purge: a purged queue stays on the shared server (RabbitMQ's quorum
    # queues hold file descriptors there); every name this test made holds `unique`
    clean_transport(request.param, unique)



def test_revenue_dag_succeeds_with_retries_on_real_workers(broker_url: str, tmp_path: Path,
                                                          unique: str) -> None:
    ledger = tmp_path / "ledger"
    queue = f"work-{unique}"
    dag = revenue.build(ledger=str(ledger), seed=SEED_FAILS_TWICE, queue=queue)
    dag.validate(["queue"])
    config = SchedulerConfig.from_env(
        {}, broker_url=broker_url, state_url=f"sqlite:///{tmp_path}/state.db",
        events_queue=f"events-{unique}", control_queue=f"control-{unique}")
    daemon = build(config, {dag.dag_id: dag})
    worker = spawn("worker", "--queues", queue, "--concurrency", "2", "--broker", broker_url,
                   "--app", "conveyor.scheduler.examples.revenue", "--log-level", "WARNING")
    try:
        started = time.time()
        run_id = trigger(daemon.engine.store, dag, started, executors=["queue"])
        run_to_end(daemon)
        store = daemon.engine.store
        run = store.one("run", run_id=run_id)
        tasks = {t["task_id"]: t for t in store.rows("run_tis", run_id=run_id)}
        attempts = store.rows("run_attempts", run_id=run_id)
    finally:
        daemon.close()
        stop(worker)

    assert run is not None and run["state"] == "success", tasks
    assert run["dag_version"] == "unversioned" or run["dag_version"]
    assert {t: (row["state"], row["attempt"]) for t, row in tasks.items()} == {
        "extract_orders": ("success", 1), "extract_payments": ("success", 3),
        "clean_orders": ("success", 1), "clean_payments": ("success", 1),
        "aggregate_revenue": ("success", 1), "load_dashboard": ("success", 1)}
    payments = [a for a in attempts if a["ti_id"] == tasks["extract_payments"]["ti_id"]]
    assert [a["outcome"] for a in payments] == ["failed", "failed", "succeeded"]
    assert "PartnerUnavailable: partner API answered 503" in payments[0]["error"]
    assert all(a["hostname"] for a in payments)
    assert revenue.ledger_counts(str(ledger)) == {
        "extract_orders": 1, "extract_payments": 3, "clean_orders": 1, "clean_payments": 1,
        "aggregate_revenue": 1, "load_dashboard": 1}
    order = sorted(tasks.values(), key=lambda t: t["started_at"])
    assert order[-1]["task_id"] == "load_dashboard"
    assert tasks["aggregate_revenue"]["started_at"] >= tasks["clean_payments"]["ended_at"]
