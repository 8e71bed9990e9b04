"""The Limits page and why a task waits, in a real browser (Debian's Chromium via
Playwright) against `conveyor ui`: a full key with its holder (a registered worker's slot)
and its waiting messages, set and cleared from the page as `conveyor limits` does, a wrong
value refused; a queued task that says how long it has waited, that no worker consumes its
queue and which limit is full, on SQLite and Postgres state. Screenshots under the test's
temp dir (screenshots/)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from conveyor import limits
from conveyor.flow import Spec
from conveyor.limits import Parcel
from conveyor.readers.limits import NO_SCHEDULER
from conveyor.state import store as stores
from conveyor.worker.registry import Registry
from tests.e2e.conftest import UiStarter
from tests.unit.test_ui_waiting import queued_run

TOKEN = "s3cret"
ACME = Spec("c", "tenant:acme", max=1)


def seed(limits_url: str) -> None:
    """tenant:acme (max 1) held by m0, m1 and m2 waiting."""
    limiter = limits.from_url(limits_url)
    try:
        for i in range(3):
            limiter.admit(Parcel(f"m{i}", "work", b"{}"), [ACME], time.time(), 600.0)
    finally:
        limiter.close()


def test_the_limits_page_shows_who_holds_a_key_and_sets_and_clears_it(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    broker_url, state = f"sqlite:///{tmp_path}/broker.db", f"sqlite:///{tmp_path}/s.db"
    seed(broker_url)          # the limiter lives in the SQLite broker's file, as workers use it
    registry = Registry(state, "box", ("work",), 2, 30.0)
    try:
        registry.beat(1, {"slots": [{"slot": 0, "task": "billing.sync", "id": "m0",
                                     "seconds": 4.0, "memory": 0}]})
        address = conveyor_ui("--broker", broker_url, "--state", state, token=TOKEN)
        page = browser_page
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(address + "limits")
        row = page.locator("table.limits tbody tr", has_text="tenant:acme")
        cells = row.locator("td")
        assert [cells.nth(i).inner_text() for i in range(5)] == [
            "tenant:acme", "max 1", "1 of 1", "2", "2"]
        assert "billing.sync on box:" in cells.nth(5).inner_text()
        page.shot("limits")

        page.fill("#token", TOKEN)
        page.click("#token-form button")
        row.locator("input[name=max]").fill("3")
        row.get_by_role("button", name="Set").click()
        expect(page.locator("#flash")).to_have_text(
            "tenant:acme: max 3 (every worker, from its next claim)")
        expect(cells.nth(1)).to_have_text("max 3 set")
        expect(cells.nth(2)).to_have_text("1 of 3")
        row.get_by_role("button", name="Clear").click()
        expect(page.locator("#flash")).to_have_text("tenant:acme: run-time limit cleared")
        expect(cells.nth(1)).to_have_text("max 1")

        new = page.locator("form.limit", has=page.locator("input[name=key]:not([type=hidden])"))
        new.locator("input[name=key]").fill("api")
        new.locator("input[name=per_second]").fill("0")
        new.get_by_role("button", name="Set").click()
        expect(page.locator("#flash.bad")).to_contain_text("per_second must be a number of "
                                                           "starts a second above 0")
        new.locator("input[name=per_second]").fill("5")
        new.locator("input[name=burst]").fill("10")
        new.get_by_role("button", name="Set").click()
        expect(page.locator("#flash")).to_have_text("api: 5/s burst 10 (every worker, from "
                                                    "its next claim)")
        expect(page.locator("table.limits tbody tr", has_text="api")).to_contain_text(
            "5/s burst 10")
        page.shot("limits-set")
    finally:
        registry.close()


def test_a_queued_task_says_how_long_and_why_it_waits(
        state_url: str, tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    store = stores.from_url(state_url)
    try:
        run_id = queued_run(store)
    finally:
        store.close()
    seed(broker_url)
    address = conveyor_ui("--broker", broker_url, "--state", state_url)
    page = browser_page
    page.goto(address + f"runs/{run_id}/tasks/sync")
    why = page.locator("ul.why li").all_inner_texts()
    assert why == ["no worker consumes queue b1_nowhere: start one with conveyor worker "
                   "--queues b1_nowhere (only workers given a state store are seen here) · "
                   "Queues", "waiting for limit tenant:acme (1 of 1 in use, 2 waiting) · Limits",
                   NO_SCHEDULER.replace("`", "")]
    queued = page.locator("h1 time.age")
    first = queued.inner_text()
    assert first.endswith(" s") or first.endswith(" min"), first
    expect(queued).not_to_have_text(first, timeout=15_000)     # it keeps counting
    page.shot("task-waiting")
    page.locator("ul.why li.why-limit a").click()
    page.wait_for_url("**/limits")
    expect(page.locator("table.limits tbody tr", has_text="tenant:acme")).to_contain_text(
        "1 of 1")
    page.go_back()

    page.goto(address + f"runs/{run_id}")
    row = page.locator("table.tasks tbody tr", has_text="sync")
    assert "queued" in row.locator("td").nth(5).inner_text()
    assert "no worker consumes queue b1_nowhere" in row.inner_text()
