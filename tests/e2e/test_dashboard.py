"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against
`conveyor ui` over real state: the revenue DAG's run with its graph and grid, on SQLite and
on Postgres; actions refused without the operator's token. Each page is saved as a
screenshot under the test's temp dir (screenshots/)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build
from conveyor.scheduler.examples import revenue
from conveyor.scheduler.runs import trigger
from tests.conftest import POSTGRES_URL, drop_postgres_schema, require_service
from tests.e2e.conftest import UiStarter
from tests.support import run_to_end, spawn, stop

SEED_FAILS_TWICE = 21
REVENUE_TASKS = ("extract_orders", "extract_payments", "clean_orders", "clean_payments",
                 "aggregate_revenue", "load_dashboard")


@pytest.fixture(params=["sqlite", "postgres"])
def state_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/state.db"
        return
    require_service("postgres")
    yield f"{POSTGRES_URL}?schema={unique}"
    drop_postgres_schema(unique)


def revenue_run(state_url: str, broker_url: str, tmp_path: Path, queue: str) -> str:
    """The revenue DAG run for real: the scheduler daemon and a `conveyor worker`."""
    dag = revenue.build(ledger=str(tmp_path / "ledger"), seed=SEED_FAILS_TWICE, queue=queue)
    dag.validate(["queue"])
    config = SchedulerConfig.from_env(
        {}, broker_url=broker_url, state_url=state_url,
        events_queue=f"events-{queue}", control_queue=f"control-{queue}")
    daemon = build(config, {dag.dag_id: dag})
    worker = spawn("worker", "--queues", queue, "--concurrency", "2", "--broker", broker_url,
                   "--app", "conveyor.scheduler.examples.revenue", "--log-level", "WARNING")
    try:
        run_id = trigger(daemon.engine.store, dag, time.time(), executors=["queue"])
        run_to_end(daemon)
    finally:
        daemon.close()
        stop(worker)
    return run_id


def test_the_revenue_run_appears_with_its_graph_and_grid(
        state_url: str, tmp_path: Path, unique: str, conveyor_ui: UiStarter,
        browser_page: Any) -> None:
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    run_id = revenue_run(state_url, broker_url, tmp_path, f"work-{unique}")
    address = conveyor_ui("--state", state_url, "--broker", broker_url)
    page = browser_page

    page.goto(address + "runs?dag=revenue")
    row = page.locator("table.runs tbody tr", has_text=run_id)
    assert "success" in row.inner_text()
    page.shot("runs")

    row.locator("a", has_text=run_id).click()
    page.wait_for_url(f"**/runs/{run_id}")
    nodes = page.locator("svg.dag a.node")
    assert sorted(nodes.evaluate_all("ns => ns.map(n => n.dataset.task)")) == \
        sorted(REVENUE_TASKS)
    assert page.locator("svg.dag a.node.st-success").count() == len(REVENUE_TASKS)
    assert page.locator("svg.dag path.edge").count() == 5
    assert page.locator("table.grid a.cell.st-success").count() == len(REVENUE_TASKS)
    page.shot("run")

    page.locator('svg.dag a.node[data-task="extract_payments"]').click()
    page.wait_for_url("**/tasks/extract_payments")
    outcomes = page.locator("table tbody tr td:nth-child(2)").all_inner_texts()
    assert outcomes == ["failed", "failed", "succeeded"], outcomes
    assert "PartnerUnavailable" in page.locator("table").inner_text()
    page.shot("task")


def post(address: str, path: str, doc: dict[str, Any],
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(address.rstrip("/") + path, json.dumps(doc).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
