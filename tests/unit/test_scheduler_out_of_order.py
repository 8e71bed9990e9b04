"""Events applied out of order (another scheduler held the `started` event, or it came
late): the outcome still records where and when the attempt ran, and a late `started` fills
in only what is missing. On both stores, since the SQL is written once per database."""

from __future__ import annotations

from conveyor.events import Event
from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from tests.support import RecordingExecutor, event

T0 = 1_700_000_000.0


def one_task(store: Store) -> tuple[Engine, RecordingExecutor, str]:
    dag = DAG("d")
    dag.command("a", ["true"])
    executor = RecordingExecutor()
    engine = Engine(store, {"queue": executor}, dags={"d": dag})
    run_id = create_run(store, dag, T0, executors=["queue"])
    engine.tick(T0)
    return engine, executor, run_id


def where(store: Store, run_id: str) -> tuple[tuple[object, ...], tuple[object, ...]]:
    ti = store.rows("run_tis", run_id=run_id)[0]
    attempt = store.rows("run_attempts", run_id=run_id)[0]
    fields = ("state", "hostname", "pid", "started_at", "ended_at")
    return tuple(ti[f] for f in fields), tuple(attempt[f] for f in fields[1:])


def test_success_before_started_keeps_host_pid_and_start(store: Store) -> None:
    engine, executor, run_id = one_task(store)
    work = executor.pop("a")
    engine.handle(event(work, "succeeded", T0 + 5, hostname="w1", pid=42,
                        started_at=T0 + 2), T0 + 5)
    engine.handle(event(work, "started", T0 + 2.5, hostname="w9", pid=7), T0 + 6)  # late
    ti, attempt = where(store, run_id)
    assert ti == ("success", "w1", 42, T0 + 2, T0 + 5)
    assert attempt == ("w1", 42, T0 + 2, T0 + 5)


def test_late_started_fills_in_what_an_older_worker_left_out(store: Store) -> None:
    engine, executor, run_id = one_task(store)
    work = executor.pop("a")
    engine.handle(event(work, "succeeded", T0 + 5), T0 + 5)   # no host, pid or start
    ti, _ = where(store, run_id)
    assert ti == ("success", None, None, None, T0 + 5)   # unknown, not a 0 s run
    engine.handle(event(work, "started", T0 + 3, hostname="w1", pid=42), T0 + 6)
    ti, attempt = where(store, run_id)
    assert ti == ("success", "w1", 42, T0 + 3, T0 + 5)
    assert attempt == ("w1", 42, T0 + 3, T0 + 5)


def test_an_unknown_event_field_from_a_newer_worker_is_ignored() -> None:
    body = (b'{"v":1,"kind":"started","message_id":"m","task":"t","attempt":1,'
            b'"some_future_field":3}')
    assert Event.decode(body).kind == "started"
