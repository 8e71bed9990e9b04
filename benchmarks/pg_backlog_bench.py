#!/usr/bin/env python3
"""How fast one real worker drains a big backlog, at its start, middle and end, per broker.

    .venv/bin/python benchmarks/pg_backlog_bench.py [--messages 100000]
        [--brokers postgres,sqlite,redis] [--rounds 1] [--concurrency 2] [--reuse 100]
        [--vacuum-every N]

Per round and broker: `--messages` no-op tasks are published with `publish_many` (10,000 a
batch) onto a queue of the run's own, then one `conveyor worker -c 2
--max-tasks-per-child=100` drains them, stopped (SIGTERM) once the queue is empty; the
queue's depth (ready + in flight) is read every 0.5 s from another process. Not `--burst`:
a burst worker asks for the depth whenever a claim comes back empty (between two tasks),
and a Postgres depth counts the queue's rows. Printed: tasks/s over the first, middle and
last 10% of the backlog (the moment each boundary was crossed, interpolated between two
readings), over the whole drain, and last ÷ first. The load average goes with every line:
the machine is shared. Brokers take turns within a round, so a busy spell skews them alike.

Postgres only: `--vacuum-every` goes to the broker URL (`vacuum_every=0` shows the drain
without the consumers' own VACUUM; the default is the broker's).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from conveyor.broker import Publication, from_url  # noqa: E402
from conveyor.message import Codec, Message  # noqa: E402
from tests.conftest import POSTGRES_URL, REDIS_URL, clean_transport  # noqa: E402

APP = "tests.integration.worker_tasks"
BATCH = 10_000
#: (name, share of the backlog left when the window opens, when it closes)
WINDOWS = [("first 10%", 1.0, 0.9), ("middle 10%", 0.55, 0.45), ("last 10%", 0.1, 0.0)]


def url_for(broker: str, tmp: Path, name: str, vacuum_every: str) -> str:
    if broker == "sqlite":
        return f"sqlite:///{tmp}/broker.db"
    if broker == "redis":
        return f"{REDIS_URL}?prefix={name}"
    extra = f"&vacuum_every={vacuum_every}" if vacuum_every else ""
    return f"{POSTGRES_URL}?schema={name}{extra}"


def fill(url: str, queue: str, n: int) -> float:
    """Publish `n` no-op tasks; seconds it took."""
    body = Codec().encode(Message(queue=queue, task="t.noop"))
    started = time.monotonic()
    with from_url(url) as broker:
        for start in range(0, n, BATCH):
            broker.publish_many([Publication(queue, body)] * min(BATCH, n - start))
    return time.monotonic() - started


def drain(url: str, queue: str, n: int, concurrency: int, reuse: int) -> list[tuple[float, int]]:
    """(monotonic time, messages left) readings from the worker's start until it exits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update({"CONVEYOR_BROKER_URL": url, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
                "CONVEYOR_LOG_LEVEL": "WARNING"})
    readings = [(time.monotonic(), n)]
    with from_url(url) as probe:
        worker = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", f"--queues={queue}",
             f"--concurrency={concurrency}", f"--max-tasks-per-child={reuse}", f"--app={APP}"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 3600
            while readings[-1][1] > 0 and time.monotonic() < deadline:
                time.sleep(0.5)
                readings.append((time.monotonic(), probe.depth(queue).active))
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited ({worker.returncode}) with "
                                     f"{readings[-1][1]} left: {worker.communicate()[1]}")
        finally:
            worker.terminate()
            worker.communicate(timeout=60)
    return readings


def crossed(readings: list[tuple[float, int]], left: float) -> float:
    """When the backlog first went down to `left` messages, interpolated between readings."""
    for (t0, n0), (t1, n1) in zip(readings, readings[1:], strict=False):
        if n1 <= left < n0 or (left == n0 and t0 == readings[0][0]):
            return t0 if n0 == n1 else t0 + (t1 - t0) * (n0 - left) / (n0 - n1)
    raise ValueError(f"the backlog never went down to {left}")


def rates(readings: list[tuple[float, int]], n: int) -> dict[str, float]:
    """tasks/s per window, from the first task done (the worker's start-up excluded)."""
    first = crossed(readings, n - 1)
    out = {}
    for name, start, end in WINDOWS:
        t0 = max(first, crossed(readings, start * n))
        out[name] = (start - end) * n / (crossed(readings, end * n) - t0)
    out["whole"] = (n - 1) / (crossed(readings, 0) - first)
    return out


def one_round(broker: str, args: argparse.Namespace) -> str:
    name = "pgbl" + uuid.uuid4().hex[:10]
    with tempfile.TemporaryDirectory() as tmp:
        url = url_for(broker, Path(tmp), name, args.vacuum_every)
        try:
            filled = fill(url, name, args.messages)
            figures = rates(drain(url, name, args.messages, args.concurrency, args.reuse),
                            args.messages)
        finally:
            if broker != "sqlite":
                clean_transport(broker, name)
    load = os.getloadavg()[0]
    cells = "  ".join(f"{k} {v:6,.0f}/s" for k, v in figures.items())
    return (f"{broker:9s} filled in {filled:5.1f} s  {cells}  last/first "
            f"{figures['last 10%'] / figures['first 10%']:.2f}  (load {load:.1f})")


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the worker and clean up
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--brokers", default="postgres,sqlite,redis")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--reuse", type=int, default=100, help="--max-tasks-per-child")
    parser.add_argument("--vacuum-every", default="", help="Postgres URL option vacuum_every")
    args = parser.parse_args()
    print(f"{args.messages:,} no-op tasks queued, then one worker -c {args.concurrency} "
          f"--max-tasks-per-child={args.reuse} drains them; tasks/s per stretch of the backlog")
    for _ in range(args.rounds):
        for broker in args.brokers.split(","):
            print(one_round(broker, args), flush=True)


if __name__ == "__main__":
    main()
