"""Several schedulers on one Postgres state store: no task is dispatched twice.

Each scheduler applies whatever events it consumes; the run's row lock (FOR UPDATE) makes
readiness of a join be judged once, the conditional UPDATEs make duplicates no-ops, and batch
claims skip rows another scheduler holds (SKIP LOCKED).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conveyor.events import Event
from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.readiness import Readiness
from conveyor.scheduler.runs import create_run
from conveyor.scheduler.workloads import workload
from conveyor.state.records import TaskInstance
from conveyor.state.store import from_url
from conveyor.state.tasks import TaskInstances
from tests.conftest import POSTGRES_URL, require_service
from tests.support import RecordingExecutor, conveyor, event, spawn, stop, wait_for

T0 = 1_700_000_000.0


@pytest.fixture
def state_url(unique: str) -> Iterator[str]:
    require_service("postgres")
    yield f"{POSTGRES_URL}?schema={unique}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(unique)))


def join_dag() -> DAG:
    dag = DAG("join")
    [dag.command("left", ["true"]), dag.command("right", ["true"])] >> dag.command(
        "child", ["true"])
    dag.validate()
    return dag


def test_two_engines_racing_on_a_join_dispatch_the_child_once(state_url: str) -> None:
    dag = join_dag()
    stores = [from_url(state_url), from_url(state_url)]
    executors = [RecordingExecutor(), RecordingExecutor()]
    engines = [Engine(s, {"queue": e}, dags={"join": dag}) for s, e in zip(stores, executors,
                                                                            strict=True)]
    runs = [create_run(stores[0], dag, T0 + i, executors=["queue"]) for i in range(20)]
    engines[0].tick(T0)
    parents = {(w.message.headers["run"], w.message.headers["task_id"]): w
               for w in executors[0].sent}
    executors[0].sent.clear()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def apply(engine: Engine, mine: str, other: str) -> None:
        try:
            for run_id in runs:
                barrier.wait(timeout=10)
                for task_id in (mine, other):   # its own event, then a duplicate of the other
                    engine.handle(event(parents[(run_id, task_id)], "succeeded", T0), T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=apply, args=(engines[0], "left", "right")),
               threading.Thread(target=apply, args=(engines[1], "right", "left"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    children = sorted(w.message.headers["run"] for e in executors for w in e.sent)
    assert children == sorted(runs)        # each child exactly once, none missing
    for store in stores:
        store.close()


def test_two_engines_applying_batches_of_many_runs_dispatch_each_child_once(
        state_url: str) -> None:
    """Each engine applies batches holding events of several runs (its own, and duplicates
    of the other's, in opposite run orders): one transaction per run, so neither waits on a
    lock while holding another, and each join is judged once."""
    dag = join_dag()
    stores = [from_url(state_url), from_url(state_url)]
    executors = [RecordingExecutor(), RecordingExecutor()]
    engines = [Engine(s, {"queue": e}, dags={"join": dag}) for s, e in zip(stores, executors,
                                                                            strict=True)]
    runs = [create_run(stores[0], dag, T0 + i, executors=["queue"]) for i in range(40)]
    engines[0].tick(T0)
    parents = {(w.message.headers["run"], w.message.headers["task_id"]): w
               for w in executors[0].sent}
    executors[0].sent.clear()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def apply(engine: Engine, mine: str, other: str, order: list[str | None]) -> None:
        try:
            for start in range(0, len(order), 8):
                batch = order[start:start + 8]
                barrier.wait(timeout=10)
                engine.handle_many([event(parents[(run_id, task_id)], "succeeded", T0)
                                    for task_id in (mine, other) for run_id in batch], T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=apply, args=(engines[0], "left", "right", runs)),
               threading.Thread(target=apply, args=(engines[1], "right", "left",
                                                    runs[::-1]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    children = sorted(w.message.headers["run"] for e in executors for w in e.sent)
    assert children == sorted(runs)        # each child exactly once, none missing
    for store in stores:
        store.close()


def waiting_on_a_lock(application_name: str) -> bool:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND application_name = %s", (application_name,)).fetchone() is not None


class HoldsAfterFirst(Engine):
    """Applies its batch's first event, says so, and goes on once the other scheduler
    waits on a lock."""

    holding = threading.Event()

    def _apply_event(self, event: Event, ref: tuple[str, int] | None,
                     tis: Mapping[str, TaskInstance], now: float) -> list[TaskInstance]:
        ready = super()._apply_event(event, ref, tis, now)
        if not self.holding.is_set():
            self.holding.set()
            wait_for(lambda: waiting_on_a_lock("sched_b"), what="B to wait on a lock")
        return ready


def test_recording_a_publish_waits_for_a_batch_of_events_holding_the_run(
        state_url: str) -> None:
    """Scheduler A applies a batch of `started` events while scheduler B records that it
    published the same two tasks, in the other order. B takes the run's lock first, so it
    waits for A's whole batch. Without it, B would hold the row A wants next while waiting
    for the one A holds: a deadlock, and one of them would stop with Postgres's error."""
    dag = DAG("pair", retries=0)
    dag.command("c0", ["true"])
    dag.command("c1", ["true"])
    stores = [from_url(f"{state_url}&application_name=sched_{n}") for n in "ab"]
    run_id = create_run(stores[0], dag, T0, executors=["queue"])
    with stores[0].transaction():                # queued, not yet recorded as published
        stores[0].rows("start_queued_runs", now=T0, limit=10)
        queued = Readiness(TaskInstances(stores[0])).whole_run(
            run_id, T0, claim={"scheduler": "gone", "lease": 60.0})
    # B records them in position order: A takes them the other way round
    backwards = [workload(ti, "events") for ti in sorted(queued, key=lambda t: -t.position)]
    a = HoldsAfterFirst(stores[0], {"queue": RecordingExecutor()}, dags={"pair": dag})
    recorder = RecordingExecutor()
    b = Engine(stores[1], {"queue": recorder}, dags={"pair": dag})
    errors: list[BaseException] = []

    def run(step: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                step()
            except BaseException as exc:
                errors.append(exc)
        thread = threading.Thread(target=guarded)
        thread.start()
        return thread

    try:
        first = run(lambda: a.handle_many([event(w, "started", T0) for w in backwards], T0))
        assert HoldsAfterFirst.holding.wait(30)
        second = run(lambda: b._dispatch(queued, T0))
        first.join(30)
        second.join(30)
        assert not errors
        assert sorted(recorder.task_ids()) == ["c0", "c1"]
        assert {r["task_id"]: r["state"] for r in stores[0].rows("run_tis", run_id=run_id)
                } == {"c0": "running", "c1": "running"}
    finally:
        for store in stores:
            store.close()


def test_two_scheduler_processes_dispatch_each_task_once(state_url: str,
                                                         tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "fan.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('fan', retries=0)\n"
        f"def step(name): return dag.command(name, ['sh', '-c', 'echo ' + name + ' >> {ledger}'])\n"
        "root, join = step('root'), step('join')\n"
        "root >> [step(f't{i}') for i in range(40)] >> join\n")
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": state_url, "CONVEYOR_DAGS_FOLDER": str(dags)}
    procs = [spawn("worker", "--queues", "default", "--concurrency", "4", "--log-level",
                   "WARNING", env=env)]
    procs += [spawn("scheduler", "--log-level", "WARNING", env=env) for _ in range(2)]
    try:
        done = conveyor("dags", "trigger", "fan", "--wait", "--timeout", "60", "--json", env=env)
    finally:
        codes = [stop(proc) for proc in procs]
    assert codes[1:] == [0, 0]             # both schedulers stopped cleanly on SIGTERM
    assert '"state": "success"' in done.stdout
    lines = ledger.read_text().split()
    assert sorted(lines) == sorted(["root", "join"] + [f"t{i}" for i in range(40)])
    store = from_url(state_url)
    try:
        attempts = store.rows("run_attempts", run_id=done.stdout.split('"run_id": "')[1]
                              .split('"')[0])
    finally:
        store.close()
    assert len(attempts) == 42 and {a["attempt"] for a in attempts} == {1}


def test_two_engines_racing_on_a_map_expand_it_once_and_close_it_once(
        state_url: str) -> None:
    """Each run maps `double` over [1, 2]: both engines apply extract's success at once (one
    expands, the other's duplicate changes nothing), then each applies the success of one
    instance at once: the map is closed once and `total` dispatched once per run."""
    dag = DAG("maps")
    numbers = dag.command("extract", ["true"])
    doubled = dag.task("m.double", id="double").expand(n=numbers)
    dag.task("m.total", id="total", args=[doubled])
    stores = [from_url(state_url), from_url(state_url)]
    executors = [RecordingExecutor(), RecordingExecutor()]
    engines = [Engine(s, {"queue": e}, dags={"maps": dag}) for s, e in zip(stores, executors,
                                                                            strict=True)]
    runs = [create_run(stores[0], dag, T0 + i, executors=["queue"]) for i in range(20)]
    engines[0].tick(T0)
    extracts = {w.message.headers["run"]: w for w in executors[0].sent}
    executors[0].sent.clear()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def apply(engine: Engine, index: int) -> None:
        try:
            for run_id in runs:
                barrier.wait(timeout=10)
                engine.handle(event(extracts[run_id], "succeeded", T0, result=[1, 2]), T0)
                barrier.wait(timeout=10)
                work = next(w for e in executors for w in e.sent
                            if w.message.headers["run"] == run_id
                            and w.message.headers["task_id"] == f"double[{index}]")
                engine.handle(event(work, "succeeded", T0, result=index), T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=apply, args=(engines[i], i)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    sent = [(w.message.headers["run"], w.message.headers["task_id"]) for e in executors
            for w in e.sent]
    assert sorted(sent) == sorted((r, t) for r in runs for t in ("double[0]", "double[1]",
                                                                  "total"))
    totals = [w.message.args for e in executors for w in e.sent
              if w.message.headers["task_id"] == "total"]
    assert totals == [([0, 1],)] * len(runs)
    for store in stores:
        store.close()
