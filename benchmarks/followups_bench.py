"""What an enqueue inside a task costs, published through its worker (worker/followups.py).

    .venv/bin/python benchmarks/followups_bench.py [--n 500] [--rounds 3] [--brokers sqlite,redis]

Per broker and round: a real `conveyor worker -c 1 --burst` runs one task that enqueues
`--n` messages one after the other (each waits for its worker's answer: runner -> pool
watcher -> publishing thread -> broker -> answer) and returns the µs per enqueue it
measured; then a client process of its own enqueues as many straight to the broker, as a
producer outside a task does. The follow-ups go to a queue nobody consumes, purged after.
Printed: the median and best round of each, and the difference (what the round trip through
the worker adds per follow-up); the task's first enqueue is timed apart: the worker opens
its publishing connection for it. On a shared machine the best round is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from conveyor.tasks import task

ROOT = Path(__file__).resolve().parents[1]
URLS = {"sqlite": "sqlite:///{tmp}/bench.db", "redis": "redis://127.0.0.1:6379/0?prefix={p}",
        "postgres": "postgresql://postgres@127.0.0.1:5432/postgres?schema={p}",
        "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F"}


@task(name="bench.fan_out", store_result=False)
def fan_out(n: int, queue: str) -> list[float]:
    """Enqueue 1 + `n` no-op messages on `queue`: ms for the first (the worker opens its
    publishing connection then), µs per enqueue for the rest."""
    from conveyor import Message
    from conveyor.client import default_client
    client = default_client()
    started = time.perf_counter()
    client.enqueue(Message(queue=queue, task="bench.noop"))
    first = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(n):
        client.enqueue(Message(queue=queue, task="bench.noop", args=(i,)))
    return [first * 1e3, (time.perf_counter() - started) / n * 1e6]


def direct(url: str, n: int, queue: str) -> float:
    """The same enqueues from a client process of its own: µs per enqueue."""
    code = ("import sys, time\n"
            "from conveyor import Message\n"
            "from conveyor.client import Client\n"
            "from conveyor.config import Settings\n"
            f"client = Client.from_settings(Settings(broker_url={url!r}))\n"
            f"client.enqueue(Message(queue={queue!r}, task='bench.noop'))\n"  # connected
            "started = time.perf_counter()\n"
            f"for i in range({n}):\n"
            f"    client.enqueue(Message(queue={queue!r}, task='bench.noop', args=(i,)))\n"
            f"print((time.perf_counter() - started) / {n} * 1e6)\n"
            "client.close()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(url),
                          capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.split()[-1])


def through_worker(url: str, n: int, queue: str) -> list[float]:
    """One task enqueueing 1 + `n` follow-ups in a real worker: what `fan_out` measured."""
    from conveyor.broker import from_url
    from conveyor.client import Client
    from conveyor.events import Event
    from conveyor.message import Message
    work, replies = f"{queue}-work", f"{queue}-r"
    broker = from_url(url)
    try:
        Client(broker).enqueue(Message(queue=work, task="bench.fan_out", args=(n, queue),
                                       reply_to=replies))
        subprocess.run([sys.executable, "-m", "conveyor.cli", "worker", f"--queues={work}",
                        "--app=benchmarks.followups_bench", "--concurrency=1", "--burst",
                        "--log-level=WARNING"], cwd=ROOT, env=_env(url), check=True,
                       timeout=600, capture_output=True)
        for delivery in broker.consume([replies], prefetch=8, timeout=1.0):
            if delivery is None:
                break
            broker.ack(delivery)
            event = Event.decode(delivery.body)
            if event.kind in ("succeeded", "failed"):
                if event.kind == "failed":
                    raise SystemExit(f"the task failed: {json.dumps(event.error)[:2000]}")
                return [float(v) for v in event.result]
        raise SystemExit("no outcome for the task")
    finally:
        for name in (queue, work, replies):
            broker.purge(name)
        broker.close()


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update({"CONVEYOR_BROKER_URL": url, "PYTHONPATH": f"{ROOT}/src:{ROOT}"})
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--brokers", default="sqlite,redis")
    args = parser.parse_args()
    print(f"{args.n} enqueues per round, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"{'broker':10} {'first in a task (ms)':>22} {'in a task (µs)':>22} "
          f"{'direct (µs)':>22} {'added (µs)':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.brokers.split(","):
            prefix = "fb" + uuid.uuid4().hex[:10]
            url = URLS[name].format(tmp=tmp, p=prefix)
            firsts, inside, outside = [], [], []
            for _ in range(args.rounds):
                first, each = through_worker(url, args.n, prefix)
                firsts.append(first)
                inside.append(each)
                outside.append(direct(url, args.n, prefix))
            _clean(name, prefix)
            print(f"{name:10} {_figures(firsts):>22} {_figures(inside):>22} "
                  f"{_figures(outside):>22} {min(inside) - min(outside):>12.0f}")


def _figures(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} (best {min(values):.0f})"


def _clean(name: str, prefix: str) -> None:
    if name in ("redis", "postgres", "rabbitmq"):
        sys.path.insert(0, str(ROOT))
        from tests.conftest import clean_transport
        clean_transport(name, prefix)


if __name__ == "__main__":
    main()
