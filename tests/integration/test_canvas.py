"""The canvas end to end: a producer's chain, group and chord run by a real scheduler and
worker (SQLite and Postgres state; SQLite, Redis and RabbitMQ brokers), results passed as
Celery passes them, a failure raised as the failing task's, and a SIGKILL of the scheduler
between two steps of a chain, or just after it claimed a chord's callback and before it
published it, costing neither a duplicate nor a loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conveyor import Signature, TaskFailed, chain, chord, group
from conveyor.state.store import from_url
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    clean_transport,
    drop_postgres_schema,
    require_service,
)
from tests.integration import canvas_tasks as t
from tests.integration.workerkit import worker_env
from tests.support import spawn, stop, wait_for

ROOT = Path(__file__).parents[2]
# (broker, state store): each broker once, each state store at least once
STACKS = [("sqlite", "sqlite"), ("redis", "postgres"), ("rabbitmq", "sqlite")]
BROKERS = {"sqlite": "sqlite:///{tmp}/broker.db", "redis": REDIS_URL + "?prefix={name}",
           "rabbitmq": RABBITMQ_URL}
STATES = {"sqlite": "sqlite:///{tmp}/state.db", "postgres": POSTGRES_URL + "?schema={name}s"}


@dataclass
class Stack:
    broker_url: str
    state_url: str
    queue: str
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]]

    def on(self, sig: Signature) -> Signature:
        """The signature on this test's own queue."""
        return sig.set(queue=self.queue)

    def enqueue(self, canvas: Any) -> Any:
        return canvas.enqueue(state_url=self.state_url, broker_url=self.broker_url)


@pytest.fixture(params=STACKS, ids=["-".join(s) for s in STACKS])
def stack(request: pytest.FixtureRequest, tmp_path: Path, unique: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    broker, state = request.param
    for service in {broker, state} - {"sqlite"}:
        require_service(service)
    (tmp_path / "dags").mkdir()
    broker_url = BROKERS[broker].format(tmp=tmp_path, name=unique)
    state_url = STATES[state].format(tmp=tmp_path, name=unique)
    queues = {"CONVEYOR_EVENTS_QUEUE": f"events-{unique}",
              "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{unique}"}
    for name, value in queues.items():   # the producer wakes the scheduler on its queue
        monkeypatch.setenv(name, value)
    env = worker_env(broker_url, CONVEYOR_STATE_URL=state_url, CONVEYOR_LOG_LEVEL="WARNING",
                     CONVEYOR_DAGS_FOLDER=str(tmp_path / "dags"),
                     CONVEYOR_QUEUE_SAMPLE_INTERVAL="0", **queues)
    made = Stack(broker_url, state_url, f"canvas-{unique}", env, [])
    yield made
    for proc in made.processes:   # SIGTERM first: a worker stops its runners
        stop(proc)
    clean_transport(broker, unique)
    if state == "postgres":
        drop_postgres_schema(f"{unique}s")


def start(stack: Stack) -> subprocess.Popen[bytes]:
    """A worker on the stack's queue and a scheduler (stopped when the test ends); the
    scheduler is returned."""
    worker = spawn("worker", "--queues", stack.queue, "--concurrency", "4", "--app",
                   "tests.integration.canvas_tasks", env=stack.env)
    scheduler = spawn("scheduler", env=stack.env)
    stack.processes += [worker, scheduler]
    return scheduler


def test_chain_group_and_chord_return_what_celery_would(stack: Stack) -> None:
    start(stack)
    on = stack.on
    chained = stack.enqueue(chain(on(t.add.s(1, 2)), on(t.add.s(10)), on(t.add.s(100))))
    chorded = stack.enqueue(chord(group(on(t.add.s(i, i)) for i in range(5)), on(t.tsum.s())))
    grouped = stack.enqueue(group(chain(on(t.add.s(i, 1)), on(t.add.s(10))) for i in range(3)))
    nested = stack.enqueue(chain(on(t.add.s(1, 1)), group(on(t.add.s(1)), on(t.add.si(5, 5))),
                                 on(t.tsum.s())))
    failing = stack.enqueue(chain(on(t.add.s(1, 1)), on(t.boom.s()), on(t.add.s(1))))
    chord_failing = stack.enqueue(chord([on(t.add.s(1, 1)), on(t.boom.s(7))], on(t.tsum.s())))

    assert chained.result(timeout=60) == 113
    assert chorded.result(timeout=60) == 20
    assert grouped.result(timeout=60) == [11, 12, 13]
    assert nested.result(timeout=60) == 13                 # sum([2 + 1, 10])
    with pytest.raises(TaskFailed, match=r"task boom-1 failed for good: .*ValueError: boom "
                                         r"after \[2\]") as caught:
        failing.result(timeout=60)
    assert caught.value.error_type == "ValueError"
    with pytest.raises(TaskFailed, match="task boom-1 failed for good"):
        chord_failing.result(timeout=60)

    store = from_url(stack.state_url)
    try:
        runs = {r["run_id"]: r for r in store.rows("recent_runs", dag_id="", state="",
                                                     limit=20)}
        tis = {r["task_id"]: r["state"] for r in store.rows("run_tis", run_id=failing.run_id)}
        callback = {r["task_id"]: r["state"] for r in
                    store.rows("run_tis", run_id=chord_failing.run_id)}
    finally:
        store.close()
    assert runs[chained.run_id]["dag_id"] == "canvas.add"
    assert runs[chorded.run_id]["run_type"] == "canvas"
    assert runs[failing.run_id]["state"] == "failed"
    assert tis == {"add-0": "success", "boom-1": "failed", "add-2": "upstream_failed"}
    assert callback == {"add-0": "success", "boom-1": "failed", "tsum-2": "upstream_failed"}


def test_a_scheduler_killed_between_chain_steps_loses_and_repeats_nothing(
        stack: Stack, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger")
    scheduler = start(stack)
    steps = chain(stack.on(t.step.s(0, ledger, "s0", 1.0)),
                  *(stack.on(t.step.s(ledger, f"s{i}", 1.0)) for i in range(1, 4)))
    handle = stack.enqueue(steps)
    store = from_url(stack.state_url)
    try:
        def state(task_id: str) -> str:
            rows = store.rows("run_tis", run_id=handle.run_id)
            return str(next(r["state"] for r in rows if r["task_id"] == task_id))

        wait_for(lambda: state("step-0") == "success" and state("step-1") == "running",
                 timeout=60, what="step 0 to succeed and step 1 to start")
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(10)
        assert handle.status() == "running"
        stack.processes.append(spawn("scheduler", env=stack.env))
        assert handle.result(timeout=90) == 4
    finally:
        store.close()
    assert Counter(Path(ledger).read_text().split()) == {f"s{i}": 1 for i in range(4)}


def test_a_scheduler_killed_publishing_a_chords_callback_loses_and_repeats_nothing(
        stack: Stack, tmp_path: Path) -> None:
    """The chord step: the members' last success and the callback's claim committed, the
    callback not published; the next scheduler publishes it once its lease lapses."""
    ledger = str(tmp_path / "ledger")
    env = {**stack.env, "CONVEYOR_SCHEDULER_EVENT_LEASE": "2"}
    stack.processes.append(spawn("worker", "--queues", stack.queue, "--concurrency", "4",
                                 "--app", "tests.integration.canvas_tasks", env=env))
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**os.environ, **env, "CONVEYOR_TEST_DIE_PUBLISHING": "gather-3"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stack.processes.append(crashing)
    handle = stack.enqueue(chord(group(stack.on(t.step.s(i, ledger, f"m{i}")) for i in range(3)),
                                 stack.on(t.gather.s(ledger, "callback"))))
    assert crashing.wait(60) == -9, "the scheduler should have died publishing the callback"
    store = from_url(stack.state_url)
    try:
        callback = store.one("run_ti_by_task", run_id=handle.run_id, task_id="gather-3")
    finally:
        store.close()
    assert (callback["state"], callback["published_at"]) == ("queued", None)
    stack.processes.append(spawn("scheduler", env=env))
    assert handle.result(timeout=90) == 6                       # 1 + 2 + 3
    assert Counter(Path(ledger).read_text().split()) == {
        "m0": 1, "m1": 1, "m2": 1, "callback": 1}
