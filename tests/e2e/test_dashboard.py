"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against
`conveyor ui` over real state: the revenue DAG's run with its graph and grid, on SQLite and
on Postgres; a dead letter requeued from the page and run by a real worker; a DAG paused and
triggered; actions refused without the operator's token. Each page is saved as a screenshot
under the test's temp dir (screenshots/)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from conveyor.broker import from_url
from conveyor.message import Codec, Message
from conveyor.scheduler import operations
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import build
from conveyor.scheduler.examples import revenue
from conveyor.scheduler.runs import trigger
from conveyor.state import store as stores
from tests.conftest import POSTGRES_URL, drop_postgres_schema, require_service
from tests.e2e.conftest import UiStarter
from tests.e2e.test_operator_cli import dead_letter_bodies
from tests.integration.workerkit import finish, start_worker
from tests.support import run_to_end, spawn, stop

SEED_FAILS_TWICE = 21
EXAMPLES = Path(revenue.__file__).parent / "dags"
REVENUE_TASKS = ("extract_orders", "extract_payments", "clean_orders", "clean_payments",
                 "aggregate_revenue", "load_dashboard")


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
    assert page.locator("table.grid td a.st-success").count() == len(REVENUE_TASKS)
    page.shot("run")

    page.locator('svg.dag a.node[data-task="extract_payments"]').click()
    page.wait_for_url("**/tasks/extract_payments")
    outcomes = page.locator("table tbody tr td:nth-child(2)").all_inner_texts()
    assert outcomes == ["failed", "failed", "succeeded"], outcomes
    assert "PartnerUnavailable" in page.locator("table").inner_text()
    assert page.locator("details.log").count() == 3
    assert page.inner_text("details.log[open] pre.log") == \
        "asking the partner API for payments (attempt 3)"
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


@pytest.fixture(params=["sqlite", "postgres"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/broker.db"
        return
    require_service("postgres")
    yield f"{POSTGRES_URL}?schema={unique}"
    drop_postgres_schema(unique)


def test_a_dead_letter_is_previewed_and_requeued_from_the_page_then_runs(
        broker_url: str, tmp_path: Path, unique: str, conveyor_ui: UiStarter,
        browser_page: Any) -> None:
    queue, marker = f"q-{unique}", tmp_path / "ran"
    body = Codec().encode(Message(queue=queue, task="t.sleep",
                                  kwargs={"seconds": 0, "marker": str(marker)}))
    dead_letter_bodies(broker_url, queue, [body], "unknown task 't.sleep': no --app has it")
    address = conveyor_ui("--broker", broker_url, "--state", f"sqlite:///{tmp_path}/s.db",
                          "-Q", queue, token="s3cret")
    page = browser_page

    page.goto(address + f"dead-letters?queue={queue}")
    row = page.locator("table.dead tbody tr")
    assert row.count() == 1 and "no --app has it" in row.inner_text()
    page.shot("dead-letters")
    row.locator("td:first-child a").click()
    page.wait_for_url("**/dead-letters/**")
    assert '"task": "t.sleep"' in page.locator("pre.body").inner_text()
    page.shot("dead-letter")

    page.go_back()
    page.fill("#token", "s3cret")
    page.click("#token-form button")
    page.locator("table.dead tbody tr button", has_text="Requeue").click()
    page.wait_for_selector("#flash.ok")
    assert page.inner_text("#flash") == ("requeued 1 dead letter(s), each keeping its "
                                         "attempt count: one more try each")
    page.wait_for_selector("p.empty")
    with from_url(broker_url) as broker:
        assert (broker.depth(queue).ready, broker.depth(queue).dead) == (1, 0)
    out = finish(start_worker(broker_url, queue))
    assert marker.exists(), out


def test_actions_are_refused_without_the_token_and_the_page_says_why(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    broker_url, queue = f"sqlite:///{tmp_path}/broker.db", "q"
    dead_letter_bodies(broker_url, queue, [b'{"not": "a message"}'], "malformed")
    flags = ("--broker", broker_url, "--state", f"sqlite:///{tmp_path}/s.db", "-Q", queue)
    read_only = conveyor_ui(*flags)
    page = browser_page
    page.goto(read_only + "dead-letters")
    assert "read-only" in page.inner_text("#read-only")
    expect(page.locator("table.dead tbody tr button", has_text="Requeue")).to_be_disabled()
    page.shot("read-only")
    status, said = post(read_only, "/api/dead-letters/requeue", {"queue": queue, "all": True})
    assert status == 403 and "actions are turned off" in said["error"]

    guarded = conveyor_ui(*flags, token="s3cret")
    doc = {"queue": queue, "all": True}
    assert post(guarded, "/api/dead-letters/purge", doc)[0] == 401
    assert post(guarded, "/api/dead-letters/purge", doc, {"X-Conveyor-Token": "nope"})[0] == 403
    status, said = post(guarded, "/api/dead-letters/purge", doc,
                        {"X-Conveyor-Token": "s3cret", "Origin": "http://evil.example"})
    assert status == 403 and "cross-site" in said["error"]
    with from_url(broker_url) as broker:
        assert broker.depth(queue).dead == 1
    assert post(guarded, "/api/dead-letters/purge", doc, {"X-Conveyor-Token": "s3cret"}) == \
        (200, {"deleted": 1, "queues": {queue: 1}, "message": "deleted 1 dead letter(s)"})


def test_a_dag_is_paused_unpaused_and_triggered_from_the_page(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    state = f"sqlite:///{tmp_path}/s.db"
    address = conveyor_ui("--broker", f"sqlite:///{tmp_path}/broker.db", "--state", state,
                          "--dags-folder", str(EXAMPLES), token="s3cret")
    page = browser_page
    page.goto(address + "dags")
    page.fill("#token", "s3cret")
    page.click("#token-form button")
    row = page.locator("table.dags tbody tr", has_text="revenue")
    page.on("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Pause", exact=True).click()
    expect(page.locator("#flash")).to_have_text("DAG revenue paused")
    expect(row.get_by_role("button", name="Unpause", exact=True)).to_be_visible()
    page.shot("dags")
    row.get_by_role("button", name="Unpause", exact=True).click()
    expect(page.locator("#flash")).to_have_text("DAG revenue unpaused")
    expect(row.get_by_role("button", name="Pause", exact=True)).to_be_visible()
    row.locator("input[name=conf]").fill('{"day": "2026-11-23"}')
    row.locator("button", has_text="Trigger").click()
    page.wait_for_url("**/runs/*")
    assert "queued" in page.inner_text("h1")
    assert '{"day": "2026-11-23"}' in page.inner_text("dl.facts")
    assert page.locator("svg.dag a.node.st-pending").count() == len(REVENUE_TASKS)


def test_an_open_run_page_follows_the_run_without_reloading(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    state = f"sqlite:///{tmp_path}/s.db"
    store = stores.from_url(state)
    try:
        dag = revenue.build(ledger=str(tmp_path / "ledger"))
        run_id = trigger(store, dag, time.time(), executors=["queue"])
        address = conveyor_ui("--broker", f"sqlite:///{tmp_path}/broker.db", "--state", state)
        page = browser_page
        page.goto(address + f"runs/{run_id}")
        node = page.locator('svg.dag a.node[data-task="extract_orders"]')
        expect(node).to_have_class(re.compile("st-pending"))
        page.evaluate("window.sameDocument = true")
        operations.mark(store, run_id, "extract_orders", "success", time.time())
        expect(node).to_have_class(re.compile("st-success"), timeout=15_000)
        expect(page.locator("#live")).to_be_visible()
        assert page.evaluate("window.sameDocument") is True   # refreshed in place, no reload
    finally:
        store.close()
