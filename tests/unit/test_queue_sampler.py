"""The scheduler's queue sampler: depth recorded per period, once, pruned; never blocking.

Real state stores (SQLite and a Postgres schema) and a real SQLite broker in tmp_path.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import broker as brokers
from conveyor.broker import Broker, Depth
from conveyor.scheduler import DAG
from conveyor.scheduler.daemon import Daemon
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.scheduler.sampler import (
    RETENTION,
    Sampler,
    growth,
    period_start,
    queues_to_sample,
    sample,
    worker_counts,
)
from conveyor.state.monitoring import Workers
from conveyor.state.records import WorkerRecord
from conveyor.state.store import Store, from_url
from tests.support import RecordingExecutor, wait_for

T0 = 1_700_000_000.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    opened = brokers.from_url(f"sqlite:///{tmp_path}/broker.db")
    yield opened
    opened.close()


def register_worker(store: Store, queues: str) -> None:
    Workers(store).beat(worker_id="box:1", hostname="box", pid=1, queues=queues,
               concurrency=2, busy=0, interval=10.0, started_at=T0, now=T0, runners=None)


def samples(store: Store, since: float = 0.0) -> list[tuple[float, str, int, int, int, int]]:
    return [(r["at"], r["queue"], r["ready"], r["in_flight"], r["delayed"], r["dead"])
            for r in store.rows("queue_samples", since=since)]


def test_one_row_per_queue_per_period_even_from_two_samplers(store: Store,
                                                              broker: Broker) -> None:
    register_worker(store, "heavy,light")
    for _ in range(3):
        broker.publish("heavy", b"{}")
    broker.publish("light", b"{}", delay=600)
    queues = queues_to_sample(store, ("default",))
    assert queues == ["default", "heavy", "light"]

    sample(store, broker, queues, T0 + 7, interval=15)
    broker.publish("heavy", b"{}")
    sample(store, broker, queues, T0 + 9, interval=15)    # same period: a second scheduler
    at = period_start(T0 + 7, 15)
    assert samples(store) == [(at, "default", 0, 0, 0, 0), (at, "heavy", 3, 0, 0, 0),
                              (at, "light", 0, 0, 1, 0)]

    sample(store, broker, queues, T0 + 16, interval=15)   # the next period
    assert [s[2] for s in samples(store) if s[1] == "heavy"] == [3, 4]


def test_samples_older_than_the_retention_are_forgotten(store: Store, broker: Broker) -> None:
    sample(store, broker, ["q"], T0, interval=15)
    sample(store, broker, ["q"], T0 + RETENTION - 15, interval=15)
    assert len(samples(store)) == 2
    sample(store, broker, ["q"], T0 + RETENTION + 30, interval=15)
    assert [s[0] for s in samples(store)] == [period_start(T0 + RETENTION - 15, 15),
                                              period_start(T0 + RETENTION + 30, 15)]


def beat(store: Store, worker: str, finished: dict[str, list[int]], at: float = T0) -> None:
    """A heartbeat row of `worker` saying what it finished per queue since it started."""
    Workers(store).beat(worker_id=worker, hostname=worker, pid=1, queues="fast",
               concurrency=2, busy=0, interval=10.0, started_at=at, now=at,
               runners=json.dumps({"limiter": "cgroup2", "slots": [], "finished": finished}))


def finished(store: Store, queue: str) -> list[tuple[int | None, int | None]]:
    return [(r["succeeded"], r["failed"]) for r in store.rows("queue_samples", since=0)
            if r["queue"] == queue]


def test_each_sample_holds_what_the_workers_finished_since_the_last(
        tmp_path: Path, store: Store, state_url: str, broker: Broker) -> None:
    sampler = Sampler(state_url, lambda: broker, 15.0, always=())
    beat(store, "w1", {"fast": [5, 1]})
    sampler.run_once(T0)                       # first period: counts unknown, baseline kept
    beat(store, "w1", {"fast": [9, 1]})
    beat(store, "w2", {"fast": [2, 3], "slow": [1, 0]})     # new since: counts from its start
    sampler.run_once(T0 + 15)
    store.exec("delete_worker", worker_id="w2")            # gone: adds nothing
    beat(store, "w1", {"fast": [10, 2]})
    sampler.run_once(T0 + 30)
    sampler.close()
    assert finished(store, "fast") == [(None, None), (6, 3), (1, 1)]
    assert finished(store, "slow") == [(1, 0)]   # no longer served: no longer sampled


def test_growth_never_goes_negative() -> None:
    assert growth({"w": {"q": (5, 5)}}, {"w": {"q": (3, 7)}}) == {"q": (0, 2)}
    worker = WorkerRecord(worker_id="w", hostname="h", pid=1, queues="q", concurrency=1, busy=0,
                          interval=5.0, started_at=0.0, heartbeat_at=0.0, runners=None)
    assert worker_counts([worker]) == {"w": {}}


class SlowBroker:
    """A real SQLite broker whose depth() waits for a gate: RabbitMQ's management API on a
    bad day."""

    def __init__(self, inner: Broker, gate: threading.Event) -> None:
        self.inner, self.gate = inner, gate
        self.calls = 0

    def depth(self, queue: str) -> Depth:
        self.calls += 1
        self.gate.wait(30)
        return self.inner.depth(queue)

    def close(self) -> None:
        self.inner.close()


def test_a_slow_depth_read_never_delays_dispatch(tmp_path: Path, broker: Broker) -> None:
    state_url = f"sqlite:///{tmp_path}/state.db"
    store = from_url(state_url)
    gate = threading.Event()
    slow = SlowBroker(brokers.from_url(f"sqlite:///{tmp_path}/broker.db"), gate)
    dag = DAG("one")
    dag.task("t.only")
    dag.validate(["queue"])
    executor = RecordingExecutor()
    daemon = Daemon(Engine(store, {"queue": executor}, dags={"one": dag}),
                    brokers.from_url(f"sqlite:///{tmp_path}/broker.db"), {"queue": executor},
                    events_queue="events", control_queue="control")
    daemon.sampler = Sampler(state_url, lambda: slow, 0.05,  # type: ignore[arg-type,return-value]
                             always=("default",))
    loop = threading.Thread(target=daemon.run)
    loop.start()
    try:
        wait_for(lambda: slow.calls, 10, "the sampler's first depth read")
        create_run(store, dag, time.time(), executors=["queue"])
        broker.publish("control", b"{}")    # what `dags trigger` does: poke the scheduler
        wait_for(lambda: executor.task_ids() == ["only"], 10,
                 "the run dispatched while the sampler waits for its broker")
        assert not samples(store)
        gate.set()
        wait_for(lambda: len(samples(store)) >= 2, 10, "two periods sampled once unblocked")
    finally:
        gate.set()
        daemon.stop()
        loop.join(30)
        daemon.close()
    assert not loop.is_alive() and not daemon.sampler._thread.is_alive()


def test_an_unreachable_store_is_logged_once_and_never_raises(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    sampler = Sampler("postgresql://nobody@127.0.0.1:1/none", lambda: broker, 15.0,
                      always=("default",))
    sampler.run_once(T0)
    sampler.run_once(T0 + 15)
    sampler.close()
    warned = [r for r in caplog.records if "cannot record queue depth" in r.message]
    assert len(warned) == 1
