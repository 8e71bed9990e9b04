"""Acting from the dashboard in a real browser (Debian's Chromium via Playwright) against
`conveyor ui` over real state, on SQLite and on Postgres: a task waiting an hour for its
retry is retried now from the run page, marked success there, marked failed and cleared from
its task page, each button the one its state allows; a read-only dashboard's buttons are
disabled; a dead letter purged from its own page leaves no stale content with live buttons.
Screenshots of each page are saved under the test's temp dir (screenshots/)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from conveyor.broker import from_url
from conveyor.message import Codec, Message
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state import store as stores
from tests.e2e.conftest import UiStarter
from tests.e2e.test_operator_cli import dead_letter_bodies
from tests.support import RecordingExecutor, event, first
from tests.unit.test_ui_actions import chain, run_state, states

TOKEN = "s3cret"


def use_token(page: Any) -> None:
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    expect(page.locator("#token-state")).to_have_text("token set")


def test_a_task_is_retried_marked_and_cleared_from_the_run_and_task_pages(
        state_url: str, tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    store = stores.from_url(state_url)
    try:
        executor = RecordingExecutor()
        engine = Engine(store, {"queue": executor}, dags={"chain": chain()})
        run_id = create_run(store, chain(), time.time(), executors=["queue"])
        assert run_id is not None
        engine.tick(time.time())
        engine.handle(event(executor.pop("a"), "failed", time.time()), time.time())
        address = conveyor_ui("--state", state_url, "--broker",
                              f"sqlite:///{tmp_path}/broker.db", token=TOKEN)
        page = browser_page
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(address + f"runs/{run_id}")
        use_token(page)
        row = page.locator("table.tasks tbody tr", has_text="up_for_retry")
        assert row.locator("button").all_inner_texts() == [
            "Retry now", "Clear", "Mark success", "Mark failed", "Cancel"]
        page.shot("run-actions")

        row.get_by_role("button", name="Retry now").click()
        expect(page.locator("#flash")).to_have_text(f"a in run {run_id}: attempt 2 of 3 is "
                                                    "due now")
        engine.tick(time.time())                 # the scheduler the poke woke: due now
        assert states(store, run_id)["a"] == ("queued", 2)
        assert executor.pop("a").message.attempt == 2
        row = page.locator("table.tasks tbody tr").first
        expect(row).to_contain_text("2/3", timeout=15_000)   # the page follows by itself
        assert row.locator("button").all_inner_texts() == ["Mark success", "Mark failed",
                                                           "Cancel"]

        row.get_by_role("button", name="Mark success").click()
        expect(page.locator("#flash")).to_have_text(f"a in run {run_id} marked success (was "
                                                    "queued)")
        expect(row.locator(".st")).to_have_text("success")
        engine.tick(time.time())
        assert executor.task_ids() == ["b"]

        page.goto(address + f"runs/{run_id}/tasks/b")
        actions = page.locator("div.actions")
        assert actions.locator("button").all_inner_texts() == ["Mark success", "Mark failed",
                                                               "Cancel"]
        actions.get_by_role("button", name="Mark failed").click()
        expect(page.locator("#flash")).to_have_text(f"b in run {run_id} marked failed (was "
                                                    "queued)")
        expect(page.locator("h1 .st")).to_have_text("failed")
        assert states(store, run_id)["c"] == ("upstream_failed", 0)
        page.shot("task-actions")

        actions.get_by_role("button", name="Clear", exact=True).click()
        expect(page.locator("#flash")).to_have_text(f"cleared b, c in run {run_id}: they run "
                                                    "again")
        expect(page.locator("h1 .st")).to_have_text("pending")
        assert states(store, run_id)["b"][0] == states(store, run_id)["c"][0] == "pending"
        assert run_state(store, run_id) == "queued"
    finally:
        store.close()


def test_a_run_is_cancelled_from_its_page(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    state = f"sqlite:///{tmp_path}/s.db"
    store = stores.from_url(state)
    try:
        executor = RecordingExecutor()
        Engine(store, {"queue": executor}, dags={"chain": chain()}).tick(time.time())
        run_id = create_run(store, chain(), time.time(), executors=["queue"])
        assert run_id is not None
        address = conveyor_ui("--state", state, "--broker", f"sqlite:///{tmp_path}/b.db",
                              token=TOKEN)
        page = browser_page
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(address + f"runs/{run_id}")
        use_token(page)
        page.get_by_role("button", name="Cancel run").click()
        expect(page.locator("#flash")).to_have_text(
            f"run {run_id} cancelled (was queued): a, b, c cancelled")
        expect(page.locator("h1 .st")).to_have_text("cancelled", timeout=15_000)
        assert run_state(store, run_id) == "cancelled"
        page.shot("run-cancelled")
    finally:
        store.close()


def test_a_task_is_cancelled_from_the_run_page_and_cleared_alone_from_its_page(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    """The two task buttons the test above does not press: Cancel (a queued task, from its
    row on the run page; what is below it will not run) and "Clear this task only"."""
    state = f"sqlite:///{tmp_path}/s.db"
    store = stores.from_url(state)
    try:
        executor = RecordingExecutor()
        engine = Engine(store, {"queue": executor}, dags={"chain": chain()})
        run_id = create_run(store, chain(), time.time(), executors=["queue"])
        assert run_id is not None
        engine.tick(time.time())
        assert states(store, run_id)["a"] == ("queued", 1)
        address = conveyor_ui("--state", state, "--broker", f"sqlite:///{tmp_path}/b.db",
                              token=TOKEN)
        page = browser_page
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(address + f"runs/{run_id}")
        use_token(page)
        row = page.locator("table.tasks tbody tr").first            # a, queued
        row.get_by_role("button", name="Cancel", exact=True).click()
        expect(page.locator("#flash")).to_have_text(f"a in run {run_id} cancelled (was "
                                                    "queued)")
        expect(row.locator(".st")).to_have_text("cancelled", timeout=15_000)
        assert states(store, run_id)["a"][0] == "cancelled"
        assert states(store, run_id)["b"][0] == "upstream_failed"
        page.shot("task-cancelled")

        page.goto(address + f"runs/{run_id}/tasks/a")
        page.locator("div.actions").get_by_role("button", name="Clear this task only").click()
        expect(page.locator("#flash")).to_contain_text(f"cleared a in run {run_id}")
        expect(page.locator("h1 .st")).to_have_text("pending")
        assert states(store, run_id)["a"][0] == "pending"
        assert states(store, run_id)["b"][0] == "upstream_failed"     # only it
        assert run_state(store, run_id) == "queued"
    finally:
        store.close()


def test_a_read_only_dashboard_disables_its_buttons(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    state = f"sqlite:///{tmp_path}/s.db"
    store = stores.from_url(state)
    try:
        run_id = create_run(store, chain(), time.time(), executors=["queue"])
    finally:
        store.close()
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    dead_letter_bodies(broker_url, "q", [b'{"not": "a message"}'], "malformed")
    address = conveyor_ui("--broker", broker_url, "--state", state, "-Q", "q")
    page = browser_page
    for path in (f"runs/{run_id}", f"runs/{run_id}/tasks/a", "dead-letters?queue=q"):
        page.goto(address + path)
        buttons = page.locator("form.action button")
        assert buttons.count() >= 2, path
        for button in buttons.all():
            expect(button).to_be_disabled()
            assert "read-only" in (button.get_attribute("title") or "")
        assert page.locator("#token-form").count() == 0
    page.shot("read-only-buttons")
    page.goto(address + f"runs/{run_id}")      # the live refresh keeps them disabled
    page.evaluate("document.addEventListener('conveyor:refreshed', "
                  "() => { window.refreshed = true; })")
    expect(page.locator("#live")).to_be_visible(timeout=15_000)
    assert page.evaluate("window.refreshed") is True   # the first poll swaps content in
    expect(page.locator("form.action button").first).to_be_disabled()


def test_a_dead_letter_purged_from_its_page_is_shown_gone(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    dead_letter_bodies(broker_url, "q", [b'{"not": "a message"}'], "malformed")
    address = conveyor_ui("--broker", broker_url, "--state", f"sqlite:///{tmp_path}/s.db",
                          "-Q", "q", token=TOKEN)
    page = browser_page
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(address + "dead-letters?queue=q")
    use_token(page)
    page.locator("table.dead tbody td:first-child a").click()
    page.wait_for_url("**/dead-letters/q/*")
    page.get_by_role("button", name="Purge").click()
    expect(page.locator("#flash")).to_have_text("deleted 1 dead letter(s)")
    expect(page.locator("#content h1")).to_have_text("404")
    expect(page.locator("#content")).to_contain_text(re.compile(
        r"no dead letter '.+' in queue 'q' \(requeued or purged already\?\)"))
    assert page.locator("#content form.action").count() == 0
    with from_url(broker_url) as broker:
        assert broker.depth("q").dead == 0
    page.shot("purged")


def test_a_dead_letter_requeued_from_its_page_with_a_fresh_budget_starts_at_attempt_1(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    body = Codec().encode(Message(queue="q", task="t.spent", attempt=4))
    dead_letter_bodies(broker_url, "q", [body], "failed for good")
    address = conveyor_ui("--broker", broker_url, "--state", f"sqlite:///{tmp_path}/s.db",
                          "-Q", "q", token=TOKEN)
    page = browser_page
    page.goto(address + "dead-letters?queue=q")
    use_token(page)
    page.locator("table.dead tbody td:first-child a").click()
    page.wait_for_url("**/dead-letters/q/*")
    page.get_by_role("button", name="Requeue with a fresh retry budget").click()
    expect(page.locator("#flash")).to_have_text(
        "requeued 1 dead letter(s) with a fresh retry budget (attempt 1)")
    expect(page.locator("#content h1")).to_have_text("404")
    with from_url(broker_url) as broker:
        assert broker.depth("q").dead == 0
        delivery = first(broker, ["q"])
        assert delivery is not None and Codec().decode(delivery.body).attempt == 1
