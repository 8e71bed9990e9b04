"""What the Queues, Workers and Autoscaler pages read and draw: the readers over real state
stores (SQLite and a Postgres schema) and a real SQLite broker, and the SVG charts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor import broker as brokers
from conveyor.autoscaler.journal import Evaluation, Journal
from conveyor.broker import Broker
from conveyor.readers.autoscaler import scaling, stale_after
from conveyor.readers.queue_history import consumers, queue_overview
from conveyor.readers.workers import worker_rows
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.runs import iso
from conveyor.scheduler.sampler import period_start, sample
from conveyor.state.store import Store
from conveyor.ui.app import Dashboard, UiConfig
from conveyor.ui.charts import depth_chart, finished_chart, nice_top
from conveyor.ui.http import Request
from conveyor.ui.pages import workers as workers_page
from conveyor.worker.registry import Registry
from tests.support import first

T0 = 1_700_000_000.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    opened = brokers.from_url(f"sqlite:///{tmp_path}/broker.db")
    yield opened
    opened.close()


def test_queue_overview_has_depth_now_rates_and_history(store: Store, broker: Broker) -> None:
    now = T0 + 3000
    broker.publish("work", b"{}")
    broker.publish("work", b"{}")
    sample(store, broker, ["default", "work"], now - 120, 15)     # counts unknown
    sample(store, broker, ["default", "work"], now - 105, 15, {"work": (2, 1)})
    sample(store, broker, ["default", "work"], now - 40, 15, {"work": (0, 0)})
    sample(store, broker, ["gone"], now - 4000, 15, {"gone": (9, 9)})   # before the window

    doc = queue_overview(store, broker, ["extra"], now)
    rows = {q["queue"]: q for q in doc["queues"]}
    assert {"default", "work", "extra", "conveyor.scheduler.events"} <= set(rows)
    assert "gone" not in rows and "gone" not in doc["depth"]
    work = rows["work"]
    assert (work["ready"], work["succeeded"], work["failed"]) == (2, 2, 1)
    assert work["failure_rate"] == pytest.approx(1 / 3, abs=0.001)
    assert work["per_minute"] == pytest.approx(3 / 60, abs=0.01)
    assert rows["default"]["failure_rate"] is None
    assert [s[1] for s in doc["depth"]["work"]] == [2, 2, 2]
    assert doc["depth"]["work"][0][0] == period_start(now - 120, 15)
    minute = period_start(now - 105, 15) // 60 * 60
    assert doc["finished"] == {"work": [[minute, 2, 1]]}


def test_counts_are_unknown_not_zero_when_no_scheduler_samples_now(
        store: Store, broker: Broker) -> None:
    now = T0 + 3000
    for queue in ("work", "quiet"):
        broker.publish(queue, b"{}")
    sample(store, broker, ["work"], now - 1200, 15)
    sample(store, broker, ["work"], now - 1185, 15, {"work": (5, 0)})   # then it stopped
    doc = queue_overview(store, broker, ["quiet"], now)
    rows = {q["queue"]: q for q in doc["queues"]}
    work = rows["work"]
    assert (work["sampled"], work["failed"], work["failure_rate"], work["per_minute"]) == \
        (False, None, None, None)
    assert work["last_sampled"] == period_start(now - 1185, 15)
    assert (rows["quiet"]["sampled"], rows["quiet"]["last_sampled"]) == (False, None)

    sample(store, broker, ["work"], now - 20, 15, {"work": (1, 4)})   # sampling again
    work = {q["queue"]: q for q in queue_overview(store, broker, [], now)["queues"]}["work"]
    assert (work["sampled"], work["succeeded"], work["failed"]) == (True, 6, 4)


def test_a_queue_lists_its_live_consumers(store: Store, broker: Broker, state_url: str) -> None:
    live = Registry(state_url, "box", ("work", "other"), 3, 5.0, clock=lambda: T0)
    gone = Registry(state_url, "old", ("work",), 1, 5.0, clock=lambda: T0 - 600)
    try:
        live.beat(1, None)
        gone.beat(0, None)
        store.exec("renew_scheduler", scheduler="sched-1", hostname="brain", pid=7, now=T0,
                   lease=30.0)
        store.exec("renew_scheduler", scheduler="sched-0", hostname="dead", pid=6,
                   now=T0 - 600, lease=30.0)
        doc = queue_overview(store, broker, ["work", "nobody"], T0 + 1,
                             scheduler_queues=("events-x", "control-x"))
        rows = {q["queue"]: q for q in doc["queues"]}
        [consumer] = rows["work"]["consumers"]
        assert (consumer["kind"], consumer["host"], consumer["concurrency"],
                consumer["busy"]) == ("worker", "box", 3, 1)
        assert rows["nobody"]["consumers"] == []
        assert [(c["kind"], c["host"]) for c in
                consumers(store, T0 + 1, ("events-x",))["events-x"]] == [("scheduler", "brain")]
    finally:
        live.close()
        gone.close()


def test_the_queues_api_has_consumers_and_null_counts_when_not_sampled(
        store: Store, tmp_path: Path, state_url: str) -> None:
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    with brokers.from_url(broker_url) as broker:
        broker.publish("b1_nowhere", b"{}")
        sample(store, broker, ["b1_nowhere"], time.time() - 1800, 15, {"b1_nowhere": (0, 5)})
    ui = Dashboard(UiConfig(SchedulerConfig.from_env({}, broker_url=broker_url,
                                                     state_url=state_url), "", ("work",)))
    registry = Registry(state_url, "box", ("work",), 2, 5.0)
    try:
        registry.beat(0, None)
        doc = json.loads(ui.handle(Request("GET", "/api/queues")).body)
    finally:
        registry.close()
        ui.close()
    rows = {q["queue"]: q for q in doc["queues"]}
    nowhere = rows["b1_nowhere"]
    assert (nowhere["ready"], nowhere["consumers"], nowhere["sampled"], nowhere["failed"],
            nowhere["failure_rate"]) == (1, [], False, None, None)
    assert [c["host"] for c in rows["work"]["consumers"]] == ["box"]


def test_worker_rows_carry_slots_and_runners(store: Store, state_url: str) -> None:
    registry = Registry(state_url, "box", ("default",), 2, 5.0, clock=lambda: T0)
    registry.beat(1, {"limiter": "cgroup2", "slots": [
        {"slot": 0, "task": "t.a", "memory": 10 << 20, "limit": 64 << 20, "seconds": 2.0},
        {"slot": 1, "task": None, "memory": 1 << 20}]})
    try:
        [row] = worker_rows(store, T0 + 4)
        assert (row["concurrency"], row["busy"], row["free"], row["stale"]) == (2, 1, 1, False)
        assert row["runners"]["slots"][0]["limit"] == 64 << 20
        assert worker_rows(store, T0 + 16)[0]["stale"]
    finally:
        registry.close()


def test_the_runners_cell_says_when_a_killed_workers_runners_die_at_ordinary_priority() -> None:
    slow = "ordinary priority (no CAP_SYS_NICE and RLIMIT_RTPRIO 0: give the worker ...)"
    assert "runners die at ordinary priority" in workers_page._runners(
        {"limiter": "cgroup2", "teardown": slow, "slots": []})
    for fast in ({"teardown": "real-time"}, {}):  # a worker from before says nothing
        assert "ordinary" not in workers_page._runners({"limiter": "cgroup2", **fast})


def test_scaling_marks_a_target_stale_once_its_autoscaler_stops_reporting(
        store: Store, state_url: str) -> None:
    journal = Journal(state_url, clock=lambda: T0)
    journal.evaluated(Evaluation("workers", "local", "default", 1, 1, 0, 3, 0, 1,
                                 "0 ready + 1 in flight over 2 slots per replica", None, 5.0))
    journal.scaled("workers", 0, 1, "activated: 1 ready + 0 in flight > activation threshold 0")
    journal.close()
    doc = scaling(store, T0 + 10)
    [target] = doc["targets"]
    assert (target["replicas"], target["desired"], target["stale"]) == (1, 1, False)
    [decision] = doc["decisions"]
    assert (decision["at"], decision["from"], decision["to"]) == (iso(T0), 0, 1)
    assert decision["reason"].startswith("activated")
    assert scaling(store, T0 + stale_after(5.0) + 1)["targets"][0]["stale"]


def test_nice_tops() -> None:
    assert [nice_top(v) for v in (0, 1, 1.5, 3, 7, 10, 11, 480)] == [1, 1, 2, 5, 10, 10, 20, 500]


def test_depth_lines_break_at_gaps_and_skip_states_that_stayed_at_zero() -> None:
    samples = [[T0 + i * 15, i, 0, 0, 0] for i in range(4)]
    samples += [[T0 + 600 + i * 15, 3, 1, 0, 0] for i in range(3)]   # after a gap
    svg = depth_chart(samples, T0 - 60, T0 + 700, "work: depth")
    assert svg.startswith('<svg class="chart depth"') and 'aria-label="work: depth"' in svg
    ready = svg.split('class="line ready" d="')[1].split('"')[0]
    assert ready.count("M") == 2 and ready.count("L") == 5
    assert 'class="line in_flight"' in svg and 'class="line delayed"' not in svg
    assert "no samples" in depth_chart([], T0, T0 + 60, "empty")


def test_finished_bars_stack_failed_on_succeeded() -> None:
    svg = finished_chart([[T0, 4, 1], [T0 + 60, 0, 2]], T0 - 600, T0 + 120, "work: finished")
    assert svg.count('class="bar succeeded"') == 1 and svg.count('class="bar failed"') == 2
    assert "4 succeeded, 1 failed" in svg
    assert "no task finished" in finished_chart([], T0, T0 + 60, "empty")


def test_the_pages_and_their_api_in_process(store: Store, tmp_path: Path, state_url: str) -> None:
    """The three endpoints answer over a real store and broker; the Queues JSON stays the
    same between two polls when nothing changed (so an open page does not re-render)."""
    from conveyor.cli.ui import dashboard
    from conveyor.ui.http import Request

    broker_url = f"sqlite:///{tmp_path}/ui-broker.db"
    ui = dashboard(broker_url, state_url, str(tmp_path), "queue", ("sick",))  # as -Q sick
    with brokers.from_url(broker_url) as broker:
        broker.publish("work", b"{}")
        sample(store, broker, ["work"], time.time() - 30, 15.0)
        broker.publish("sick", b"{}")
        delivery = first(broker, ["sick"])
        assert delivery is not None
        broker.dead_letter(delivery, "unknown task")

    def get(path: str, status: int = 200, **query: str) -> bytes:
        response = ui.handle(Request("GET", path, query=query))
        assert response.status == status, response.body
        return response.body

    try:
        check_pages(get)
    finally:
        ui.close()


def check_pages(get: Callable[..., bytes]) -> None:
    """What each page and endpoint answers with one sampled queue and nothing else."""
    first, second = get("/api/queues"), get("/api/queues")
    assert first == second
    doc = json.loads(first)
    assert [q["ready"] for q in doc["queues"] if q["queue"] == "work"] == [1]
    assert doc["window"] == 3600 and len(doc["depth"]["work"]) == 1
    page = get("/queues")
    assert b'<svg class="chart depth"' in page
    assert b'<a class="warn" href="/dead-letters?queue=sick">1</a>' in page
    assert json.loads(get("/api/workers")) == {"workers": []}
    assert json.loads(get("/api/autoscaler")) == {"targets": [], "decisions": []}
    assert b"no autoscaler has reported" in get("/autoscaler")
    assert b"no worker registered" in get("/workers")
    listed = {e["path"]: e["about"] for e in json.loads(get("/api"))["endpoints"]}
    assert {"/api/queues", "/api/workers", "/api/autoscaler"} <= set(listed)
    assert all(listed[p] for p in ("/api/queues", "/api/workers", "/api/autoscaler"))
    refused = json.loads(get("/api/queues", 400, minutes="100000"))
    assert "minutes='100000'" in refused["error"]
    assert json.loads(get("/api/queues", minutes="5"))["window"] == 300


def test_dead_letters_of_a_queue_nobody_consumes_are_listed(
        store: Store, tmp_path: Path, state_url: str) -> None:
    """As `conveyor dead-letters list` does: the broker says which queues hold dead letters,
    so one no worker, run or flag names still shows (and in the page's queue filter)."""
    broker_url = f"sqlite:///{tmp_path}/broker.db"
    with brokers.from_url(broker_url) as broker:
        broker.publish("b2_nobody", b"poison")
        delivery = first(broker, ["b2_nobody"])
        assert delivery is not None
        broker.dead_letter(delivery, "oom_killed: over its cap")
    ui = Dashboard(UiConfig(SchedulerConfig.from_env({}, broker_url=broker_url,
                                                     state_url=state_url), "", ()))
    try:
        doc = json.loads(ui.handle(Request("GET", "/api/dead-letters")).body)
        page = ui.handle(Request("GET", "/dead-letters")).body
    finally:
        ui.close()
    assert "b2_nobody" in doc["queues"]
    assert [d["reason"] for d in doc["dead_letters"] if d["queue"] == "b2_nobody"] == [
        "oom_killed: over its cap"]
    assert b'<option value="b2_nobody"' in page
