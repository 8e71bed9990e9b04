#!/usr/bin/env python3
"""Once per key's cost: nothing for a message without a key, a store round trip for one with.

    .venv/bin/python benchmarks/unique_bench.py [--tasks 300] [--rounds 3] [--old-src PATH]

1. enqueue: `Client.enqueue` of a message without a key, and with one (a hold in the store:
   the embedded SQLite file, Redis, Postgres), in microseconds per message;
2. end to end: `--tasks` no-op tasks through a real `conveyor worker --burst` (embedded
   SQLite broker, 2 slots, runners reused): without keys on this checkout, without keys on
   `--old-src` (a checkout from before the feature: the hot path's before/after), and with a
   key each (every settle gives one back). Seconds per task from the first task's end to the
   last's; rounds interleaved, best of each kept, so a busy machine skews all alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from conveyor import limits
from conveyor.broker import from_url as broker_from_url
from conveyor.client import Client
from conveyor.message import Message

ROOT = Path(__file__).parents[1]
STORES = {"sqlite": "sqlite:///{tmp}/keys.db",
          "redis": "redis://127.0.0.1:6379/0?prefix=bench{name}",
          "postgres": "postgresql://postgres@127.0.0.1:5432/postgres?schema=bench{name}"}
APP = '''
from conveyor import task

@task(name="bench.noop", max_retries=0, store_result=False)
def noop() -> None:
    return None
'''


def enqueue_cost(tmp: Path, n: int) -> None:
    for store, template in STORES.items():
        name = uuid.uuid4().hex[:8]
        url = f"sqlite:///{tmp}/enqueue-{name}.db"
        try:
            client = Client(broker_from_url(url),
                            limiter=limits.from_url(template.format(tmp=tmp, name=name)))
        except Exception as exc:  # noqa: BLE001 - a store that is not running is skipped
            print(f"{store}: skipped ({exc})")
            continue
        plain = _per_message(client, n, lambda i: "")
        keyed = _per_message(client, n, lambda i: f"k{i}")
        client.close()
        _drop(store, name)
        print(f"enqueue, keys in {store} (broker: SQLite file): without a key {plain:.0f} us, "
              f"with a key {keyed:.0f} us per message")


def _per_message(client: Client, n: int, key: object) -> float:
    started = time.perf_counter()
    for i in range(n):
        client.enqueue(Message(queue="q", task="bench.noop"), unique_key=key(i))  # type: ignore[operator]
    return (time.perf_counter() - started) / n * 1e6


def _drop(store: str, name: str) -> None:
    if store == "redis":
        import redis
        r = redis.Redis()
        keys = list(r.scan_iter(match=f"bench{name}:*"))
        if keys:
            r.delete(*keys)
        r.close()
    elif store == "postgres":
        import psycopg
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                             autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS bench{name} CASCADE")


def worker_round(tmp: Path, src: Path, keyed: bool, n: int) -> float:
    url = f"sqlite:///{tmp}/drain-{uuid.uuid4().hex[:6]}.db"
    client = Client(broker_from_url(url), limiter=limits.from_url(url))
    for i in range(n):
        client.enqueue(Message(queue="bench", task="bench.noop"),
                       unique_key=f"k{i}" if keyed else "")
    client.close()
    env = {**os.environ, "CONVEYOR_BROKER_URL": url, "CONVEYOR_LOG_LEVEL": "INFO",
           "CONVEYOR_LOG_FORMAT": "json", "PYTHONPATH": f"{tmp}:{src}"}
    argv = [sys.executable, "-m", "conveyor.cli", "worker", "-Q", "bench", "-c", "2",
            "--app", "benchapp", "--burst", "--max-tasks-per-child", "100000"]
    done = subprocess.run(argv, env=env, cwd=tmp, check=True, capture_output=True, text=True)
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()
             if line.startswith("{")]
    ends = [line["at"] for line in lines if " succeeded in " in line.get("message", "")]
    assert len(ends) == n, (done.stdout + done.stderr)[-2000:]
    if keyed:  # every key was given back
        store = limits.from_url(url)
        assert all(store.hold(f"k{i}", "probe", time.time(), 1) == "probe" for i in range(n))
        store.close()
    return (ends[-1] - ends[0]) / (n - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old-src", type=Path, default=None,
                        help="src/ of a checkout from before the feature")
    parser.add_argument("--src", type=Path, default=ROOT / "src",
                        help="src/ to run the workers of this checkout from (a copy on the "
                             "same file system as --old-src: where the files live moved "
                             "the drain by ~6%% here)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        (tmp / "benchapp.py").write_text(APP)
        enqueue_cost(tmp, args.tasks)
        sides = {"no key": (args.src, False), "with a key": (args.src, True)}
        if args.old_src is not None:
            sides["no key, before"] = (args.old_src, False)
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(args.rounds):
            for side, (src, keyed) in sides.items():
                best[side] = min(best[side], worker_round(tmp, src, keyed, args.tasks))
        base = best["no key"]
        print(f"end to end, {args.tasks} no-op tasks on a worker (SQLite, 2 slots), best of "
              f"{args.rounds}: " + "; ".join(
                  f"{side} {t * 1000:.2f} ms per task ({t / base:.2f}x)"
                  for side, t in best.items()))


if __name__ == "__main__":
    main()
