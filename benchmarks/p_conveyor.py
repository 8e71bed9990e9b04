"""Conveyor spec for the peer benchmarks in ../shared/peers (see its README).

Name it as module:p_conveyor:VARIANT with VARIANT = BROKER[-reuseN][-init], BROKER one of
redis, rabbitmq, postgres, sqlite; `-reuse100` runs the worker with --max-tasks-per-child=100;
`-init` opens the instrumentation's Redis connection in a `worker_process_init` hook (the
README documents it), in the idle runner before its task arrives, instead of in the task.
The worker is `conveyor worker -c 2`: 2 runner slots, a fresh isolated runner per task
unless reuse is asked for. Tasks record completion through the peers' `common` module.
"""

from __future__ import annotations

import os
import time

import common  # type: ignore[import-not-found]

from conveyor import broker as brokers
from conveyor.client import Client
from conveyor.tasks import task, worker_process_init

#: BENCH_QUEUE names a queue of your own when others benchmark on the same servers.
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
URLS = {
    "redis": "redis://127.0.0.1:6379/0?prefix=conveyor-bench",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
    "postgres": "postgresql://postgres@127.0.0.1:5432/postgres?schema=conveyor_bench",
    "sqlite": "sqlite:////tmp/conveyor-bench/bench.db",
}


@task(name="bench.noop", queue=QUEUE)
def noop() -> None:
    common.mark_done()


@task(name="bench.lat", queue=QUEUE)
def lat(t_enq: float) -> None:
    common.record_latency(t_enq, time.time())


if os.environ.get("P_CONVEYOR_INIT") == "1":

    @worker_process_init
    def connect_counter() -> None:
        common.client().ping()


class Spec:
    counter_url = common.COUNTER_URL

    def __init__(self, variant: str) -> None:
        variant, init, _ = variant.partition("-init")
        os.environ["P_CONVEYOR_INIT"] = "1" if init else "0"  # the workers inherit it
        broker, _, reuse = variant.partition("-reuse")
        self.url = URLS[broker if broker in URLS else "redis"]
        self.reuse = int(reuse) if reuse else 1
        os.environ["CONVEYOR_BROKER_URL"] = self.url  # the workers inherit it
        self.client = Client(brokers.from_url(self.url))

    def setup(self) -> None:
        self.client.broker.depth(QUEUE)

    def purge(self) -> None:
        self.client.broker.purge(QUEUE)

    def enqueue_noop(self, n: int) -> None:
        for _ in range(n):
            self.client.enqueue(noop.message())

    def enqueue_lat(self, t: float) -> None:
        self.client.enqueue(lat.message((t,)))

    def worker_cmds(self) -> list[list[str]]:
        return [["conveyor", "worker", "-A", "p_conveyor", "-Q", QUEUE, "-c", "2",
                 f"--max-tasks-per-child={self.reuse}", "--log-level=WARNING"]]
