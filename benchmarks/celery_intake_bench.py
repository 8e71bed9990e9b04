#!/usr/bin/env python
"""Celery intake drain rate beside Celery's own prefork worker: same queue, machine and run.

usage (from the project root, after ../shared/peers/setup.sh and
`/tmp/peers-venv/bin/pip install -e .`):

    BENCH_COUNTER_URL=redis://127.0.0.1:6379/13 PYTHONPATH=benchmarks \
        /tmp/peers-venv/bin/python benchmarks/celery_intake_bench.py \
        [--brokers redis,rabbitmq] [--n 5000] [--runs 3] [--reuse] [--native]

For each broker it runs the peers harness (../shared/peers/bench.py, method in its README)
on each configuration, back to back: Celery's prefork worker, 2 processes
(`module:celery_intake_bench:celery-<broker>`, the peers' `celery-<broker>` on a queue of
its own) and the intake (`module:celery_intake_bench:<broker>`): the same Celery producer
(`p_celery`'s `noop` onto Celery's queue `intake-bench`), drained by
`conveyor worker -c 2 --celery-queues=intake-bench`, whose intake moves each message to
Conveyor's own broker (the native transport of the same kind) where the supervisor runs it
in an isolated runner. It prints both drain rates and their ratio. `--reuse` adds a variant
with `--max-tasks-per-child=100` (Celery's prefork reuses its processes; Conveyor's default
is a fresh runner per task); `--native` adds Conveyor's own producer and worker on the same
broker (benchmarks/p_conveyor.py), to show what the intake itself costs.

Measured on the 2-core development machine shared with other work (load 2-10), 2,000
tasks, BENCH_COUNTER_URL=redis://127.0.0.1:6379/13, after the feed moved to batches; two
separate runs (each ratio is from one run):

| variant | Celery prefork | intake | ratio |
|---|---|---|---|
| Redis, fresh runner per task | 502/s, 293/s | 69/s, 48/s | 0.14, 0.16 |
| Redis, --max-tasks-per-child=100 | 502/s, 293/s | 567/s, 398/s | 1.13, 1.36 |
| RabbitMQ, fresh runner per task | 475/s, 362/s | (crash in pool.release), 46/s | -, 0.13 |
| RabbitMQ, --max-tasks-per-child=100 | 475/s, 362/s | 193/s, 187/s | 0.41, 0.52 |

After the worker's RabbitMQ read-ahead (one delivery beyond its slots, acks sent at once),
1,000 tasks, two runs, load average 9-12: RabbitMQ reuse 0.87, 0.87 (Celery 99/s, 103/s;
intake 86/s, 89/s); RabbitMQ fresh runner per task 0.16, 0.19. With the worker's read-ahead
of 8 and the zygote started beside the supervisor, 1,500 tasks, two runs, load average ~1:
RabbitMQ reuse 1.04, 1.05 (Celery 704/s, 706/s; intake 728/s, 739/s); fresh runner per task
0.34, 0.34 (237/s, 238/s).

What the intake itself costs, `--native` (RabbitMQ, one run): intake 38/s and 230/s, native
Conveyor (its own producer and worker, same broker) 37/s and 244/s, Celery 366/s; intake ÷
native 1.03 (fresh runner) and 0.94 (reuse). The rest of the gap to Celery is the worker's.

The feed alone (no supervisor: `Feed`/`RedisFeed` moving 3,000 messages) now moves about
1,300/s from RabbitMQ and 1,500-1,800/s from Redis (before batching: 300-650/s), so the
intake is no longer the limit: with a fresh runner per task the runner's cost is (the
worker's issue 16 work), on RabbitMQ the supervisor's claim and settle round trips on
Conveyor's RabbitMQ queue are (py-spy: 80 % of the supervisor thread waits in them while
the feed thread idles).

As a spec module (`Spec(variant)`, variant `redis|rabbitmq[-reuseN]`) it registers Conveyor
tasks `noop` and `lat` under Celery's task names; they record completion through the peers'
`common` module exactly like the Celery tasks do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conveyor.tasks import task

#: The peers harness: PEERS_DIR, else ../shared/peers beside the checkout (a worktree sits
#: one level deeper, hence the second candidate).
PEERS = Path(os.environ.get("PEERS_DIR") or next(
    (p for p in (Path(__file__).resolve().parents[i] / "shared/peers" for i in (2, 3))
     if p.is_dir()), Path(__file__).resolve().parents[2] / "shared/peers"))
RESULTS = Path(os.environ.get("PEERS_RESULTS", "/tmp/peers-results"))
CELERY_URLS = {"redis": "redis://127.0.0.1:6379/0",
               "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}
CONVEYOR_URLS = {"redis": "redis://127.0.0.1:6379/0?prefix=conveyor-intake-bench",
                 "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F"}
#: The Celery queue of both sides of the comparison (see `Spec`).
QUEUE = "intake-bench"
INTAKE_QUEUE = f"celery.{QUEUE}"


try:  # the peers' instrumentation: on the path in the harness and its workers, not in main()
    import common  # type: ignore[import-not-found]
except ImportError:
    common = None


@task(name="noop")
def noop() -> None:
    common.mark_done()


@task(name="lat")
def lat(t_enq: float) -> None:
    common.record_latency(t_enq, time.time())


class Spec:
    """The peers harness's view of the intake (see ../shared/peers/README.md).

    Variants: `redis|rabbitmq[-reuseN]` (the intake) and `celery-redis|celery-rabbitmq`
    (Celery's prefork worker, as the peers' `celery-<broker>`). Both use the Celery queue
    `QUEUE`, not `celery`, so a peers run of someone else on the same servers cannot mix
    with this one (set BENCH_COUNTER_URL to a Redis db of your own for the same reason).
    """

    def __init__(self, variant: str) -> None:
        self.celery_worker = variant.startswith("celery-")
        kind, _, reuse = variant.removeprefix("celery-").partition("-reuse")
        self.kind = kind if kind in CELERY_URLS else "redis"
        self.reuse = int(reuse) if reuse else 1
        os.environ["BENCH_BROKER"] = self.kind  # p_celery picks its broker from it
        os.environ["CONVEYOR_BROKER_URL"] = CONVEYOR_URLS[self.kind]  # workers inherit it
        import p_celery  # type: ignore[import-not-found]
        self.celery = p_celery
        self.counter_url = common.COUNTER_URL

    def setup(self) -> None:
        self._purge_celery()

    def _purge_celery(self) -> None:
        with self.celery.app.connection_for_write() as conn:
            try:
                conn.default_channel.queue_purge(QUEUE)
            except Exception as exc:  # noqa: BLE001 - the queue may not exist yet
                print("purge:", exc)

    def purge(self) -> None:
        from conveyor.broker import from_url
        self._purge_celery()
        with from_url(CONVEYOR_URLS[self.kind]) as broker:
            broker.purge(INTAKE_QUEUE)

    def enqueue_noop(self, n: int) -> None:
        for _ in range(n):
            self.celery.noop.apply_async(queue=QUEUE)

    def enqueue_lat(self, t: float) -> None:
        self.celery.lat.apply_async((t,), queue=QUEUE)

    def worker_cmds(self) -> list[list[str]]:
        if self.celery_worker:  # as the peers' celery-<broker>, on QUEUE
            return [["celery", "-A", "p_celery", "worker", "--pool=prefork", "--concurrency=2",
                     "--loglevel=WARNING", "-Q", QUEUE, "-n", f"intake-bench-{self.kind}@%h"]]
        return [["conveyor", "worker", "-A", "celery_intake_bench", "-c", "2",
                 f"--celery-queues={QUEUE}", f"--celery-broker={CELERY_URLS[self.kind]}",
                 f"--max-tasks-per-child={self.reuse}", "--log-level=WARNING"]]


def run_config(config: str, n: int, runs: int) -> dict[str, Any]:
    """One configuration through the peers harness; its saved results."""
    bench = [sys.executable, str(PEERS / "bench.py"), config, "--n", str(n), "--runs",
             str(runs), "--skip-latency"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(bench, check=True, env=env)
    return json.loads((RESULTS / f"{config.replace(':', '_')}.json").read_text())


def median_rate(result: dict[str, Any]) -> float:
    """The median drain rate of the runs that finished (0 if none did)."""
    rates = [r["rate"] for r in result["runs"] if "rate" in r]
    return statistics.median(rates) if rates else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reuse", action="store_true",
                        help="also run the intake with --max-tasks-per-child=100")
    parser.add_argument("--native", action="store_true",
                        help="also run Conveyor's own producer and worker (p_conveyor) on the "
                        "same broker: what the intake costs over native Conveyor")
    args = parser.parse_args()
    rows = []
    for kind in args.brokers.split(","):
        celery = median_rate(run_config(f"module:celery_intake_bench:celery-{kind}", args.n,
                                        args.runs))
        for variant in [kind] + ([f"{kind}-reuse100"] if args.reuse else []):
            intake = median_rate(run_config(f"module:celery_intake_bench:{variant}", args.n,
                                            args.runs))
            native = median_rate(run_config(f"module:p_conveyor:{variant}", args.n,
                                            args.runs)) if args.native else 0.0
            rows.append((variant, celery, intake, native))
    report(rows, args.n, args.runs)


def report(rows: list[tuple[str, float, float, float]], n: int, runs: int) -> None:
    print(f"\nmedian drain rate of {runs} runs of {n} no-op tasks, 2 slots each (tasks/s)")
    print(f"{'variant':<20}{'Celery prefork':>15}{'intake':>8}{'ratio':>7}"
          f"{'native Conveyor':>17}{'intake/native':>15}")
    for variant, celery, intake, native in rows:
        ratio = intake / celery if celery else float("nan")
        line = f"{variant:<20}{celery:>15.0f}{intake:>8.0f}{ratio:>7.2f}"
        if native:
            line += f"{native:>17.0f}{intake / native:>15.2f}"
        print(line)


if __name__ == "__main__":
    main()
