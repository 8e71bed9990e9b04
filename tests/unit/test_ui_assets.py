"""The dashboard's Assets page and its JSON API, on SQLite and Postgres state with a real
SQLite broker for the scheduler's poke: an asset touched and an event sent over the API
(with the token; a re-sent dedupe key a no-op) are queued for the DAGs consuming them, the
page and /api/assets say which DAG produces and consumes each, and its latest events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.scheduler import DAG, Asset, Event
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.engine import Engine
from conveyor.state.assets import Assets
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.http import Request
from tests.support import RecordingExecutor
from tests.unit.test_ui_actions import TOKEN, call

ORDERS = Asset("s3://lake/orders")


@pytest.fixture
def ui(store: Store, tmp_path: Path, state_url: str) -> Iterator[Dashboard]:
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url,
                                      dags_folder=str(tmp_path / "dags"))
    produce = DAG("produce")
    produce.task("x.extract", outlets=[ORDERS])
    report = DAG("report", schedule=ORDERS | Event("invoice.paid"))
    report.task("x.report")
    Engine(store, {"queue": RecordingExecutor()},
           dags={"produce": produce, "report": report}).sync_dags(time.time())
    dashboard = Dashboard(UiConfig(config, TOKEN))
    yield dashboard
    dashboard.close()


def test_touch_and_send_over_the_api_then_the_page_shows_them(ui: Dashboard,
                                                              store: Store) -> None:
    status, doc = call(ui, "POST", "/api/assets/touch", {"uri": ORDERS.uri,
                                                         "extra": {"rows": 5}})
    assert status == 200 and doc["new"], doc
    first = call(ui, "POST", "/api/events/invoice.paid", {"payload": {"id": 1},
                                                          "dedupe_key": "inv-1"})[1]
    again = call(ui, "POST", "/api/events/invoice.paid", {"payload": {"id": 1},
                                                          "dedupe_key": "inv-1"})[1]
    assert first["new"] and not again["new"] and again["event_id"] == first["event_id"]
    assert sorted(e.uri for e in Assets(store).queued(10)["report"]) == [
        "event:invoice.paid", ORDERS.uri]

    status, listing = call(ui, "GET", "/api/assets")
    rows = {r["uri"]: r for r in listing["assets"]}
    assert rows[ORDERS.uri]["producers"] == ["produce"]
    assert rows[ORDERS.uri]["consumers"] == ["report"]
    assert rows["event:invoice.paid"]["events"] == 1
    one = ui.handle(Request("GET", "/api/asset", query={"uri": ORDERS.uri},
                            headers={"host": "127.0.0.1:8700"}))
    assert one.status == 200 and json.loads(one.body)["latest"][0]["extra"] == {"rows": 5}
    page = ui.handle(Request("GET", "/assets", query={"uri": ORDERS.uri},
                             headers={"host": "127.0.0.1:8700"}))
    assert page.status == 200 and b"Latest events of s3://lake/orders" in page.body
    assert b'{&quot;rows&quot;: 5}' in page.body


def test_refusals(ui: Dashboard) -> None:
    assert call(ui, "POST", "/api/assets/touch", {"uri": ORDERS.uri}, token="")[0] == 401
    assert call(ui, "POST", "/api/events/x", {}, token="guess")[0] == 403
    status, doc = call(ui, "POST", "/api/assets/touch", {"extra": {}})
    assert status == 400 and "URI" in doc["error"]
    status, doc = call(ui, "POST", "/api/assets/touch", {"uri": "event:invoice.paid"})
    assert status == 400 and "events send invoice.paid" in doc["error"]
    status, doc = call(ui, "POST", "/api/events/x", {"payload": "[1"})
    assert status == 400 and "not JSON" in doc["error"]
    assert ui.handle(Request("GET", "/api/asset", query={"uri": "nowhere"},
                             headers={"host": "127.0.0.1:8700"})).status == 404
