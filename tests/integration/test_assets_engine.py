"""Assets and events in the engine, on SQLite and Postgres, with a recording executor: a
task's outlet records an event with its success, a DAG scheduled on assets gets one run per
time its condition holds (AND, OR, a list), the events in its tasks' context; a DAG on an
`Event` gets a run per event with the payload as conf, a dedupe key making a re-send a
no-op; and two engines on one store create each run once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from conveyor.errors import ConfigError
from conveyor.readers.dags import dag_row
from conveyor.scheduler import DAG, Asset, Event
from conveyor.scheduler import assets as conditions
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.metrics import StateCollector
from conveyor.scheduler.runs import create_run
from conveyor.state import assets as stored
from conveyor.state.assets import Assets, event_key, record_event
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0
ORDERS, PAYMENTS = Asset("s3://lake/orders"), Asset("s3://lake/payments")


@pytest.fixture
def store(state_url: str) -> Iterator[Store]:
    opened = from_url(state_url)
    yield opened
    opened.close()


def producer() -> DAG:
    dag = DAG("produce")
    dag.task("assets.extract", outlets=[ORDERS])
    return dag


def consumer(dag_id: str, schedule: object) -> DAG:
    dag = DAG(dag_id, schedule=schedule)  # type: ignore[arg-type]
    dag.task("assets.report")
    return dag


def engine_for(store: Store, executor: RecordingExecutor, *dags: DAG) -> Engine:
    engine = Engine(store, {"queue": executor}, dags={d.dag_id: d for d in dags})
    engine.sync_dags(T0)
    return engine


def runs_of(store: Store, dag_id: str) -> list[dict[str, object]]:
    return store.rows("recent_runs", dag_id=dag_id, state="", limit=100)


def test_an_outlet_starts_its_consumer_once_with_the_events_in_context(store: Store) -> None:
    executor = RecordingExecutor()
    both = consumer("both", [ORDERS, PAYMENTS])
    either = consumer("either", ORDERS | PAYMENTS)
    engine = engine_for(store, executor, producer(), both, either)
    create_run(store, engine.dags["produce"], T0, executors=["queue"])
    engine.tick(T0)
    work = executor.pop("extract")
    engine.handle(event(work, "started", T0 + 1), T0 + 1)
    engine.handle(event(work, "succeeded", T0 + 2, result={"rows": 42, "by": "?"},
                        asset_extra={ORDERS.uri: {"by": "extract"}}), T0 + 2)
    (orders_event,) = Assets(store).events(ORDERS.uri)
    assert orders_event.extra == {"rows": 42, "by": "extract"}
    assert orders_event.task_id == "extract"

    engine.tick(T0 + 3)
    engine.tick(T0 + 4)
    assert executor.task_ids() == ["report"]          # `either` ran; `both` waits
    headers = executor.sent[0].message.headers
    assert headers["dag"] == "either"
    (seen,) = json.loads(headers["asset_events"])
    assert seen["uri"] == ORDERS.uri and seen["extra"] == {"rows": 42, "by": "extract"}

    record_event(store, PAYMENTS.uri, {}, T0 + 5, source="test")
    engine.tick(T0 + 5)
    assert sorted(w.message.headers["dag"] for w in executor.sent) == ["both", "either",
                                                                       "either"]
    both_work = next(w for w in executor.sent if w.message.headers["dag"] == "both")
    uris = [e["uri"] for e in json.loads(both_work.message.headers["asset_events"])]
    assert uris == [ORDERS.uri, PAYMENTS.uri]
    engine.tick(T0 + 6)
    assert len(executor.sent) == 3                    # consumed: nothing runs twice
    assert [r["run_type"] for r in runs_of(store, "both")] == ["asset"]


def test_an_event_starts_a_run_per_event_with_its_payload_and_dedupes(store: Store) -> None:
    executor = RecordingExecutor()
    paid = consumer("on_paid", Event("invoice.paid"))
    engine = engine_for(store, executor, paid)
    key = event_key("invoice.paid")
    first = record_event(store, key, {"invoice": 1}, T0, source="test", dedupe_key="i1")
    again = record_event(store, key, {"invoice": 1}, T0, source="test", dedupe_key="i1")
    record_event(store, key, {"invoice": 2}, T0, source="test", dedupe_key="i2")
    assert first[1] and not again[1] and again[0] == first[0]
    engine.tick(T0 + 1)
    confs = sorted(json.loads(w.message.headers["conf"])["invoice"] for w in executor.sent)
    assert confs == [1, 2]
    engine.tick(T0 + 2)
    assert len(executor.sent) == 2


def test_an_event_as_one_input_of_an_asset_condition(store: Store, state_url: str) -> None:
    executor = RecordingExecutor()
    dag = consumer("mixed", ORDERS & Event("orders.approved"))
    engine = engine_for(store, executor, dag)
    record_event(store, event_key("orders.approved"), {"by": "ann"}, T0, source="test")
    engine.tick(T0 + 1)
    assert executor.sent == []
    collector = StateCollector(state_url)
    families = {f.name: f for f in collector.collect()}
    collector.close()
    assert [(s.labels, s.value) for s in families["conveyor_asset_events_queued"].samples] \
        == [({"dag": "mixed"}, 1.0)]
    record_event(store, ORDERS.uri, {}, T0 + 2, source="test")
    engine.tick(T0 + 3)
    (work,) = executor.sent
    assert json.loads(work.message.headers["conf"]) == {"by": "ann"}


def test_two_engines_on_one_store_create_each_run_once(store: Store, state_url: str) -> None:
    other_store = from_url(state_url)
    try:
        sent_a, sent_b = RecordingExecutor(), RecordingExecutor()
        a = engine_for(store, sent_a, consumer("c", ORDERS))
        b = engine_for(other_store, sent_b, consumer("c", ORDERS))
        for i in range(5):
            record_event(store, ORDERS.uri, {"i": i}, T0 + i, source="test")
            a.asset_runs.tick(a.dags, ["queue"], T0 + i + 0.5)
            b.asset_runs.tick(b.dags, ["queue"], T0 + i + 0.5)
        assert a.asset_runs.runs_created + b.asset_runs.runs_created == 5
        assert len(runs_of(store, "c")) == 5
        assert Assets(store).queued(100) == {}
    finally:
        other_store.close()


def test_a_run_whose_events_were_taken_meanwhile_rolls_back(store: Store) -> None:
    """The guard: the events were consumed between the read and the delete (another
    scheduler): the run this one created is rolled back with its delete."""
    executor = RecordingExecutor()
    engine = engine_for(store, executor, consumer("c", ORDERS))
    record_event(store, ORDERS.uri, {}, T0, source="test")
    engine.asset_runs.before_consume = lambda run_id: Assets(store).consume("c", 0, 10**9)
    assert engine.asset_runs.tick(engine.dags, ["queue"], T0 + 1) == 0
    assert runs_of(store, "c") == []


def test_conditions_and_their_errors() -> None:
    cond = (ORDERS & PAYMENTS) | Event("go")
    assert conditions.from_spec(cond.spec()) == cond
    assert cond.met({"event:go"}) and cond.met({ORDERS.uri, PAYMENTS.uri})
    assert not cond.met({ORDERS.uri})
    assert not cond.events_only() and (Event("a") | Event("b")).events_only()
    assert stored.EVENT_PREFIX == conditions.EVENT_PREFIX
    shown = dag_row(consumer("shown", [ORDERS, PAYMENTS]), None, None)["schedule"]
    assert shown == "(s3://lake/orders & s3://lake/payments)"
    with pytest.raises(ConfigError, match="names events"):
        Asset("event:x")
    with pytest.raises(Exception, match="outlets takes Asset"):
        DAG("bad").task("x.y", outlets=["s3://a"])
    with pytest.raises(Exception, match="give a cron expression, an Asset"):
        DAG("bad2", schedule=5)  # type: ignore[arg-type]
