"""The dashboard's operational pages in a real browser (Debian's Chromium via Playwright),
over what a real `conveyor up` records on SQLite and on Postgres state: the Queues page
charts the depth its scheduler sampled and the revenue run's finished tasks; the Workers
page shows its workers, updates by itself when one of them takes a task (with the memory
the task holds against its cap), and marks a silent worker stale; the Autoscaler page shows
the target and the decisions that started the workers. Screenshots of each page are saved
under the test's temp dir (screenshots/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import broker as brokers
from conveyor.client import Client
from conveyor.message import Message
from conveyor.scheduler.sampler import sample
from conveyor.state import store as stores
from conveyor.state.monitoring import QueueSamples, Workers
from tests.conftest import POSTGRES_URL, drop_postgres_schema, require_service
from tests.e2e.conftest import UiStarter
from tests.e2e.test_up import interrupt, read_until, start_up
from tests.support import wait_for

MiB = 1024 * 1024
#: A command task that holds 64 MiB (every page touched) until the file {release} exists (a
#: minute at most): as long as the test looks at it, and no longer (it slept 12 s).
HOLD = ("import os, time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
        "any(os.path.exists({release!r}) or time.sleep(0.05) for _ in range(1200))")


@pytest.fixture(params=["sqlite", "postgres"])
def up_env(request: pytest.FixtureRequest, tmp_path: Path, unique: str
           ) -> Iterator[dict[str, str]]:
    """The environment of a `conveyor up` that samples queue depth every second."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    home = tmp_path / "home"
    env.update(CONVEYOR_HOME=str(home), CONVEYOR_QUEUE_SAMPLE_INTERVAL="1",
               CONVEYOR_BROKER_URL=f"sqlite:///{home}/broker.db",
               CONVEYOR_STATE_URL=f"sqlite:///{home}/scheduler.db")
    if request.param == "postgres":
        require_service("postgres")
        env["CONVEYOR_STATE_URL"] = f"{POSTGRES_URL}?schema={unique}"
    yield env
    if request.param == "postgres":
        drop_postgres_schema(unique)


def test_queues_workers_and_autoscaler_pages_over_a_real_up(
        up_env: dict[str, str], processes: list[subprocess.Popen[str]], conveyor_ui: UiStarter,
        browser_page: Any) -> None:
    up = start_up(up_env, processes)
    read_until(up, "of revenue: success", timeout=120)
    state_url, broker_url = up_env["CONVEYOR_STATE_URL"], up_env["CONVEYOR_BROKER_URL"]
    store = stores.from_url(state_url)
    try:
        wait_for(lambda: len(store.rows("queue_samples", since=0)) >= 4, 30,
                 "a few depth samples from up's scheduler")
        fabricate_a_silent_worker(store)
        address = conveyor_ui("--state", state_url, "--broker", broker_url)
        page = browser_page

        release = Path(up_env["CONVEYOR_HOME"]) / "release"
        workers_page(page, address, broker_url, store, release)  # first: workers idle 30 s
        queues_page(page, address)
        autoscaler_page(page, address)
    finally:
        store.close()
    assert interrupt(up) == []


def queues_page(page: Any, address: str) -> None:
    page.goto(address + "queues")
    row = page.locator("table.queues tbody tr", has_text="default").first
    assert row.locator("td").first.inner_text() == "default"
    chart = page.locator('section.queue[data-queue="default"]')
    assert chart.locator("svg.chart.depth path.line.in_flight").count() == 1  # the held task
    assert chart.locator("svg.chart.finished rect.bar.succeeded").count() >= 1
    assert chart.locator("svg.chart.finished rect.bar.failed").count() >= 1  # a retried task
    failed = int(row.locator("td").nth(7).inner_text())
    assert failed >= 1 and row.locator("td").nth(8).inner_text().endswith("%")
    assert re.fullmatch(r"\d+ workers? \(\d+ slots\)", row.locator("td").nth(5).inner_text())
    events = page.locator("table.queues tbody tr", has_text="conveyor.scheduler.events")
    assert events.locator("td").nth(5).inner_text() == "1 scheduler"   # up's, by its lease
    page.shot("queues")


def autoscaler_page(page: Any, address: str) -> None:
    page.goto(address + "autoscaler")
    target = page.locator("table.targets tbody tr", has_text="workers")
    cells = target.locator("td").all_inner_texts()
    assert cells[1] == "local" and cells[2] == "default" and cells[-1] == "ok", cells
    first = page.locator("table.decisions tbody tr").last.inner_text()
    assert "0 → 1" in first and "activated" in first, first
    page.shot("autoscaler")


def _at_least(value: str | None, low: float) -> float:
    """`value` as a number if it is at least `low`, else 0 (not yet)."""
    number = float(value or 0)
    return number if number >= low else 0.0


def workers_page(page: Any, address: str, broker_url: str, store: stores.Store,
                 release: Path) -> None:
    page.goto(address + "workers")
    stale = page.locator("table.workers tbody tr", has_text="crashed-box")
    assert "stale" in stale.inner_text()
    live = page.locator("table.workers tbody tr", has_text="workers-")  # up's local workers
    assert live.count() >= 1 and "ok" in live.first.inner_text()
    enqueued = time.time()
    hold = HOLD.format(release=str(release))
    with brokers.from_url(broker_url) as broker:   # the page is open: it must update itself
        Client(broker).enqueue(Message(queue="default", command=(sys.executable, "-c", hold),
                                       memory_limit=256 * MiB))
    meter = page.locator("table.workers ul.runners meter").first
    meter.wait_for(timeout=30_000)
    # the first heartbeat may catch the task still allocating: the page follows it up
    held = wait_for(lambda: _at_least(meter.get_attribute("value"), 64 * MiB), 30,
                    "the runner's memory to reach 64 MiB on the page")
    assert held < 256 * MiB and float(meter.get_attribute("max") or 0) == 256 * MiB
    assert "of 256 MiB" in page.locator("table.workers ul.runners").first.inner_text()
    page.shot("workers")
    # the Queues page charts it in flight: a depth sample must have caught it so
    wait_for(lambda: any(s.queue == "default" and s.in_flight >= 1
                         for s in QueueSamples(store).since(enqueued)), 30,
             "a depth sample with the held task in flight")
    release.touch()
    wait_for(lambda: page.locator("table.workers ul.runners meter").count() == 0, 40,
             "the held task finished")


def fabricate_a_silent_worker(store: stores.Store) -> None:
    """A worker whose heartbeats stopped a minute ago (killed, frozen or cut off)."""
    then = time.time() - 60
    Workers(store).beat(worker_id="crashed-box:4242", hostname="crashed-box", pid=4242,
               queues="default", concurrency=4, busy=1, interval=2.0, started_at=then - 600,
               now=then, runners=None)


def test_the_queues_page_says_not_sampled_and_no_consumer_instead_of_zeros(
        tmp_path: Path, conveyor_ui: UiStarter, browser_page: Any) -> None:
    """A queue with failures while no scheduler sampled, and work nobody listens to."""
    state, broker_url = f"sqlite:///{tmp_path}/s.db", f"sqlite:///{tmp_path}/broker.db"
    store = stores.from_url(state)
    try:
        with brokers.from_url(broker_url) as broker:
            broker.publish("b1_nowhere", b"{}")
            then = time.time() - 1800            # a scheduler sampled half an hour ago
            sample(store, broker, ["b1_nowhere"], then - 15, 15)
            sample(store, broker, ["b1_nowhere"], then, 15, {"b1_nowhere": (3, 0)})
    finally:
        store.close()
    address = conveyor_ui("--state", state, "--broker", broker_url, "-Q", "b1_nowhere")
    page = browser_page
    page.goto(address + "queues")
    cells = page.locator("table.queues tbody tr", has_text="b1_nowhere").locator("td")
    assert cells.nth(1).inner_text() == "1"
    assert cells.nth(5).inner_text() == "none"
    assert "warn" in (cells.nth(5).locator("span").get_attribute("class") or "")
    assert [cells.nth(i).inner_text() for i in (6, 7, 8)] == ["not sampled"] * 3
    assert "no scheduler has sampled it since" in (
        cells.nth(7).locator("span").get_attribute("title") or "")
    page.shot("queues-not-sampled")
