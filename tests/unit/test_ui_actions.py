"""The dashboard's task actions over its JSON API (clear, mark, retry now), on SQLite and
Postgres state with a real SQLite broker for the scheduler's poke: what each one changes,
the buttons each state offers, and every refusal (no token, bad state, a task that may still
run, a run or task that is not there, GET)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import broker as brokers
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.http import Request, Response
from tests.support import RecordingExecutor, event, first

#: Runs start a minute ago: the dashboard acts at the real time.
T0 = time.time() - 60
TOKEN = "s3cret"


def chain() -> DAG:
    dag = DAG("chain", retries=2, retry_delay=3600)
    dag.command("a", ["true"]) >> dag.command("b", ["true"]) >> dag.command("c", ["true"])
    dag.validate()
    return dag


@pytest.fixture
def ui(store: Store, tmp_path: Path, state_url: str) -> Iterator[Dashboard]:
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=state_url,
                                      dags_folder=str(tmp_path / "dags"))
    dashboard = Dashboard(UiConfig(config, TOKEN))
    yield dashboard
    dashboard.close()


@pytest.fixture
def run(store: Store) -> tuple[str, Engine, RecordingExecutor]:
    """A run of a -> b -> c whose `a` failed once and waits an hour for its retry."""
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"chain": chain()})
    run_id = create_run(store, chain(), T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    engine.handle(event(executor.pop("a"), "failed", T0 + 1), T0 + 1)
    return run_id, engine, executor


def call(ui: Dashboard, method: str, path: str, doc: dict[str, Any] | None = None,
         token: str = TOKEN) -> tuple[int, dict[str, Any]]:
    headers = {"host": "127.0.0.1:8700", "content-type": "application/json"}
    if token:
        headers["x-conveyor-token"] = token
    response: Response = ui.handle(Request(method, path, headers=headers,
                                           body=json.dumps(doc or {}).encode()))
    return response.status, json.loads(response.body)


def run_state(store: Store, run_id: str) -> str:
    found = store.one("run", run_id=run_id)
    assert found is not None, f"no run {run_id}"
    return str(found["state"])


def states(store: Store, run_id: str) -> dict[str, tuple[str, int]]:
    return {r["task_id"]: (r["state"], r["attempt"]) for r in store.rows("run_tis", run_id=run_id)}


def test_retry_now_then_mark_then_clear_through_the_api(
        ui: Dashboard, store: Store, run: tuple[str, Engine, RecordingExecutor]) -> None:
    run_id, engine, executor = run
    base = f"/api/runs/{run_id}/tasks"
    assert states(store, run_id)["a"] == ("up_for_retry", 1)

    status, doc = call(ui, "POST", f"{base}/a/retry")
    assert status == 200 and doc["message"] == f"a in run {run_id}: attempt 2 of 3 is due now"
    now = time.time()
    engine.tick(now + 0.01)                               # not an hour later
    assert states(store, run_id)["a"] == ("queued", 2)
    assert executor.pop("a").message.attempt == 2                # dispatched again
    with brokers.from_url(ui.config.scheduler.settings.broker_url) as broker:
        assert broker.depth(ui.config.scheduler.control_queue).ready == 1   # poked

    status, doc = call(ui, "POST", f"{base}/a/clear")
    assert status == 409 and "may still run" in doc["error"]
    status, doc = call(ui, "POST", f"{base}/a/mark", {"state": "success"})
    assert (status, doc["was"]) == (200, "queued")
    assert doc["message"] == f"a in run {run_id} marked success (was queued)"
    engine.tick(now + 3)
    assert executor.task_ids() == ["b"]
    engine.handle(event(executor.pop("b"), "succeeded", now + 4), now + 4)
    engine.handle(event(executor.pop("c"), "succeeded", now + 5), now + 5)
    assert run_state(store, run_id) == "success"

    status, doc = call(ui, "POST", f"{base}/b/clear", {"only": True})
    assert (status, doc["cleared"]) == (200, ["b"])
    status, doc = call(ui, "POST", f"{base}/a/clear")
    assert (status, doc["cleared"]) == (200, ["a", "b", "c"])
    assert doc["message"] == f"cleared a, b, c in run {run_id}: they run again"
    assert run_state(store, run_id) == "queued"


def test_task_actions_refuse_what_they_cannot_do(
        ui: Dashboard, run: tuple[str, Engine, RecordingExecutor]) -> None:
    run_id = run[0]
    base = f"/api/runs/{run_id}/tasks"
    assert call(ui, "POST", f"{base}/a/mark", {"state": "success"}, token="")[0] == 401
    assert call(ui, "POST", f"{base}/a/mark", {"state": "success"}, token="guess")[0] == 403
    status, doc = call(ui, "POST", f"{base}/a/mark", {"state": "running"})
    assert status == 400 and "mark a task one of success, failed" in doc["error"]
    status, doc = call(ui, "POST", f"{base}/b/retry")
    assert status == 409 and "it is pending, not up_for_retry" in doc["error"]
    status, doc = call(ui, "POST", f"{base}/zz/clear")
    assert status == 404 and doc["error"] == f"no task 'zz' in run {run_id!r}"
    status, doc = call(ui, "POST", "/api/runs/nope/tasks/a/retry")
    assert status == 404 and "no run 'nope'" in doc["error"]
    status, doc = call(ui, "GET", f"{base}/a/clear")
    assert status == 405 and "takes POST" in doc["error"]
    read_only = Dashboard(UiConfig(ui.config.scheduler, ""))
    try:
        status, doc = call(read_only, "POST", f"{base}/a/retry")
        assert status == 403 and "read-only" in doc["error"]
    finally:
        read_only.close()


def test_each_task_offers_the_actions_its_state_allows(
        ui: Dashboard, run: tuple[str, Engine, RecordingExecutor]) -> None:
    run_id = run[0]
    page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
    rows = {row.split("</a>", 1)[0].rsplit(">", 1)[-1]: row
            for row in page.split('<table class="tasks">', 1)[1].split("<tr>")[2:]}
    assert _buttons(rows["a"]) == ["Retry now", "Clear", "Mark success", "Mark failed",
                                   "Cancel"]
    assert _buttons(rows["b"]) == ["Mark success", "Mark failed", "Cancel"]
    task = ui.handle(Request("GET", f"/runs/{run_id}/tasks/a")).body.decode()
    assert _buttons(task.split('<div class="actions">', 1)[1].split("</div>", 1)[0]) == [
        "Retry now", "Clear", "Clear this task only", "Mark success", "Mark failed",
        "Cancel"]
    assert f'action="/api/runs/{run_id}/tasks/a/retry"' in task
    assert "next try 20" in rows["a"] and "next try 20" in task    # an hour from the failure
    assert "<body>" in task
    read_only = Dashboard(UiConfig(ui.config.scheduler, ""))
    try:
        assert '<body class="read-only">' in read_only.handle(
            Request("GET", f"/runs/{run_id}")).body.decode()
    finally:
        read_only.close()


def _buttons(markup: str) -> list[str]:
    return [b.split("</button>", 1)[0] for b in markup.split('<button type="submit">')[1:]]


def test_a_dead_letter_requeued_keeps_its_attempt_count_or_with_fresh_gets_a_fresh_budget(
        ui: Dashboard, tmp_path: Path) -> None:
    """As `conveyor dead-letters requeue [--fresh]`: the dashboard says which one it did."""
    from conveyor.message import Message
    codec = ui.config.scheduler.settings.codec()
    with brokers.from_url(f"sqlite:///{tmp_path}/broker.db") as broker:
        for n in (1, 2):
            broker.publish("b3_dead", codec.encode(Message(queue="b3_dead", task=f"t{n}",
                                                           attempt=3)))
            delivery = first(broker, ["b3_dead"])
            assert delivery is not None
            broker.dead_letter(delivery, "failed for good")
        plain, fresh = broker.dead_letters("b3_dead", limit=10)
    page = ui.handle(Request("GET", f"/dead-letters/b3_dead/{fresh.id}")).body.decode()
    assert '<input type="hidden" name="fresh" value="1">' in page
    assert "Requeue with a fresh retry budget" in page
    assert call(ui, "POST", "/api/dead-letters/requeue", {"queue": "b3_dead", "id": plain.id}
                ) == (200, {"requeued": 1, "queues": {"b3_dead": 1}, "fresh": False,
                            "message": "requeued 1 dead letter(s), each keeping its attempt "
                                       "count: one more try each"})
    status, doc = call(ui, "POST", "/api/dead-letters/requeue",
                       {"queue": "b3_dead", "id": fresh.id, "fresh": True})
    assert (status, doc["fresh"], doc["message"]) == (
        200, True, "requeued 1 dead letter(s) with a fresh retry budget (attempt 1)")
    with brokers.from_url(f"sqlite:///{tmp_path}/broker.db") as broker:
        assert broker.dead_letters("b3_dead", limit=10) == []
        attempts = {}
        while (delivery := first(broker, ["b3_dead"])) is not None:
            message = codec.decode(delivery.body)
            attempts[message.task] = message.attempt
            broker.ack(delivery)
    assert attempts == {"t1": 3, "t2": 1}


def test_cancel_a_task_a_run_and_a_message_over_the_api(
        ui: Dashboard, store: Store, run: tuple[str, Engine, RecordingExecutor]) -> None:
    run_id = run[0]
    status, doc = call(ui, "POST", f"/api/runs/{run_id}/tasks/a/cancel")
    assert (status, doc["result"], doc["was"]) == (200, "cancelled", "up_for_retry")
    assert doc["message"] == f"a in run {run_id} cancelled (was up_for_retry)"
    assert states(store, run_id)["a"] == ("cancelled", 1)
    assert states(store, run_id)["b"][0] == "upstream_failed"
    assert run_state(store, run_id) == "failed"
    status, doc = call(ui, "POST", f"/api/runs/{run_id}/tasks/a/cancel")
    assert (status, doc["result"]) == (200, "already_cancelled")
    status, doc = call(ui, "POST", f"/api/runs/{run_id}/cancel")
    assert (status, doc["result"], doc["was"]) == (200, "finished", "failed")
    status, doc = call(ui, "POST", f"/api/runs/{run_id}/tasks/zz/cancel")
    assert (status, doc["result"]) == (404, "unknown") and "no task 'zz'" in doc["error"]
    status, doc = call(ui, "POST", "/api/runs/nope/cancel")
    assert (status, doc["result"]) == (404, "unknown")
    status, doc = call(ui, "POST", "/api/messages/01HZZZZZZZZZZZZZZZZZZZZZZZ/cancel")
    assert (status, doc["result"]) == (200, "cancelled")
    status, doc = call(ui, "POST", "/api/messages/01HZZZZZZZZZZZZZZZZZZZZZZZ/cancel")
    assert (status, doc["result"]) == (200, "already_cancelled")


def test_cancel_a_whole_run_over_the_api_and_its_button(
        ui: Dashboard, store: Store, run: tuple[str, Engine, RecordingExecutor]) -> None:
    run_id = run[0]
    page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
    assert f'action="/api/runs/{run_id}/cancel"' in page
    assert call(ui, "POST", f"/api/runs/{run_id}/cancel", token="")[0] == 401
    assert run_state(store, run_id) == "running"
    status, doc = call(ui, "POST", f"/api/runs/{run_id}/cancel")
    assert (status, doc["result"], sorted(doc["cancelled"])) == (200, "cancelled",
                                                                 ["a", "b", "c"])
    assert run_state(store, run_id) == "cancelled"
    page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
    assert f'action="/api/runs/{run_id}/cancel"' not in page


def test_a_skipped_task_is_drawn_pink_in_graph_grid_and_legend_and_can_be_cleared(
        store: Store, ui: Dashboard) -> None:
    dag = DAG("branchy")
    choose = dag.branch("flows.choose")
    choose >> [dag.command("left", ["true"]), dag.command("right", ["true"])]
    dag.validate()
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"branchy": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    assert run_id is not None
    engine.tick(T0)
    engine.handle(event(executor.pop("choose"), "succeeded", T0 + 1, result="left"), T0 + 1)
    assert states(store, run_id)["right"] == ("skipped", 0)
    page = ui.handle(Request("GET", f"/runs/{run_id}")).body.decode()
    assert 'st-skipped' in page.split('<svg', 1)[1].split("</svg>", 1)[0]     # the graph
    assert 'st-skipped' in page.split('class="grid"', 1)[1]                    # the grid
    assert 'class="st st-skipped">skipped<' in page.split('class="legend"', 1)[1]
    rows = {row.split("</a>", 1)[0].rsplit(">", 1)[-1]: row
            for row in page.split('<table class="tasks">', 1)[1].split("<tr>")[2:]}
    assert _buttons(rows["right"]) == ["Clear", "Mark success", "Mark failed"]
    task = ui.handle(Request("GET", f"/runs/{run_id}/tasks/choose")).body.decode()
    assert "<dt>trigger rule</dt><dd><code>all_success</code> · branch: follows" in task
    task = ui.handle(Request("GET", f"/runs/{run_id}/tasks/right")).body.decode()
    assert "<dt>trigger rule</dt><dd><code>all_success</code></dd>" in task
    css = ui.handle(Request("GET", "/static/app.css")).body.decode()
    for rule in (".st-skipped", "svg.dag .node.st-skipped rect", "table.grid a.st-skipped"):
        assert f"{rule} {{" in css and "var(--skipped)" in css
