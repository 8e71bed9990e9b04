"""The dashboard's Limits page and its set/clear actions over the JSON API, on the limiter
the workers use (here the SQLite broker's file) and a real state store (SQLite and Postgres)
for the worker registry that says where each token holder runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import limits
from conveyor.flow import Spec
from conveyor.limits import Parcel
from conveyor.scheduler.config import SchedulerConfig
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.http import Request
from conveyor.worker.registry import Registry
from tests.unit.test_ui_actions import TOKEN, call

ACME = Spec("c", "tenant:acme", max=1)


@pytest.fixture
def ui(store: Store, tmp_path: Path, state_url: str) -> Iterator[Dashboard]:
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url)
    dashboard = Dashboard(UiConfig(config, TOKEN))
    yield dashboard
    dashboard.close()


@pytest.fixture
def limiter(ui: Dashboard) -> Iterator[limits.Limiter]:
    s = ui.config.scheduler.settings
    opened = limits.from_url(s.stores().limits)
    yield opened
    opened.close()


def test_a_key_shows_its_use_waiting_and_who_holds_it(
        ui: Dashboard, limiter: limits.Limiter, store: Store, state_url: str) -> None:
    now = time.time()
    for i in range(3):
        limiter.admit(Parcel(f"m{i}", "work", b"{}"), [ACME], now, 60.0)
    registry = Registry(state_url, "box", ("work",), 2, 5.0)
    try:
        registry.beat(1, {"slots": [{"slot": 0, "task": "billing.sync", "id": "m0",
                                     "seconds": 4.0, "memory": 0}]})
        status, doc = call(ui, "GET", "/api/limits")
        page = ui.handle(Request("GET", "/limits")).body.decode()
    finally:
        registry.close()
    assert status == 200
    [row] = doc["limits"]
    assert (row["key"], row["limit"], row["in_use"], row["waiting"], row["denied"],
            row["full"]) == ("tenant:acme", "max 1", 1, 2, 2, True)
    [holder] = row["holders"]
    assert (holder["id"], holder["task"], holder["host"], holder["slot"]) == \
        ("m0", "billing.sync", "box", 0)
    assert '<span class="warn">1 of 1</span>' in page and "<b>billing.sync</b> on box:" in page


def test_set_and_clear_a_limit_as_the_cli_does(ui: Dashboard, limiter: limits.Limiter) -> None:
    status, doc = call(ui, "POST", "/api/limits/set", {"key": "tenant:acme", "max": "3",
                                                        "per_second": "", "burst": ""})
    assert (status, doc["message"]) == (200, "tenant:acme: max 3 (every worker, from its "
                                             "next claim)")
    usage = {u.key: u for u in limiter.usage(time.time())}["tenant:acme"]
    assert (usage.max, usage.overridden) == (3, True)
    status, doc = call(ui, "POST", "/api/limits/set", {"key": "api", "per_second": 5,
                                                        "burst": 10})
    assert doc["message"] == "api: 5/s burst 10 (every worker, from its next claim)"
    assert call(ui, "POST", "/api/limits/clear", {"key": "tenant:acme"})[1]["message"] == \
        "tenant:acme: run-time limit cleared"
    assert call(ui, "POST", "/api/limits/clear", {"key": "tenant:acme"})[1]["message"] == \
        "tenant:acme: had no run-time limit"


@pytest.mark.parametrize(("doc", "says"), [
    ({"max": "2"}, "say which key"),
    ({"key": "k"}, "give --max, --per-second or --burst"),
    ({"key": "k", "max": "two"}, "max='two': give a whole number"),
    ({"key": "k", "max": "0"}, "max must be a whole number above 0"),
    ({"key": "k", "per_second": "-1"}, "per_second must be a number of starts a second"),
    ({"key": "k", "per_second": "fast"}, "per_second='fast': give a number"),
])
def test_a_wrong_limit_is_refused_and_nothing_changes(
        ui: Dashboard, limiter: limits.Limiter, doc: dict[str, Any], says: str) -> None:
    status, said = call(ui, "POST", "/api/limits/set", doc)
    assert status == 400 and says in said["error"]
    assert limiter.usage(time.time()) == []


def test_limit_actions_need_the_token_and_a_reachable_store(
        ui: Dashboard, store: Store, state_url: str) -> None:
    assert call(ui, "POST", "/api/limits/set", {"key": "k", "max": 1}, token="")[0] == 401
    assert call(ui, "POST", "/api/limits/clear", {"key": "k"}, token="nope")[0] == 403
    assert call(ui, "GET", "/api/limits/clear")[0] == 405
    config = SchedulerConfig.from_env({}, broker_url="redis://127.0.0.1:1/0",
                                      state_url=state_url)
    unreachable = Dashboard(UiConfig(config, TOKEN))
    try:
        status, doc = call(unreachable, "GET", "/api/limits")
        assert status == 503 and "redis://127.0.0.1:1/0" in doc["error"]
    finally:
        unreachable.close()
