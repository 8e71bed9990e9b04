#!/usr/bin/env python3
"""Flow control's cost per task: an unlimited task (must stay ~0) against a limited one.

    .venv/bin/python benchmarks/flow_control_bench.py [--tasks 300] [--stores sqlite,redis,postgres]

Three figures, each in one run so that the ratio is fair:

1. the worker's check on an unlimited message (`Supervisor._limits_of`: one header lookup,
   no store touched), in nanoseconds, beside the same call on a limited message (admit)
   plus its release, per store, in microseconds;
2. end to end: `--tasks` no-op tasks through a real `conveyor worker --burst` (embedded
   SQLite broker, 2 slots, runners reused), unlimited, then with a concurrency limit they
   never reach (so every task pays admit + release and none waits): seconds per task and
   the limited/unlimited ratio.

Rounds are interleaved (unlimited, limited, unlimited, limited) and the best of each kept,
so a busy machine skews both sides alike.
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

from conveyor import Limit, task
from conveyor.broker import from_url as broker_from_url
from conveyor.client import Client
from conveyor.flow import Spec
from conveyor.limits import Parcel
from conveyor.limits import from_url as limiter_from_url
from conveyor.message import Message
from conveyor.worker.supervisor import Supervisor

ROOT = Path(__file__).parents[1]
STORES = {"sqlite": "sqlite:///{tmp}/limits.db",
          "redis": "redis://127.0.0.1:6379/0?prefix=bench{name}",
          # commit=async: as a worker whose Postgres broker holds the limits (see limits.sql)
          "postgres": "postgresql://postgres@127.0.0.1:5432/postgres?schema=bench{name}"
                      "&commit=async"}
APP = '''
from conveyor import Limit, task

@task(name="bench.free", max_retries=0, store_result=False)
def free() -> None:
    return None

@task(name="bench.limited", concurrency=Limit(key="bench", max=1000), max_retries=0,
      store_result=False)
def limited() -> None:
    return None
'''


@task(name="bench.check", concurrency=Limit(key="k", max=1000))
def _check() -> None:
    return None


def check_cost(stores: list[str], tmp: Path, n: int) -> None:
    plain = Message(queue="q", task="bench.free")
    started = time.perf_counter()
    for _ in range(n * 100):
        Supervisor._limits_of(None, None, plain)  # type: ignore[arg-type]
    free_ns = (time.perf_counter() - started) / (n * 100) * 1e9
    print(f"unlimited message: {free_ns:.0f} ns per task (a header lookup; no store)")
    spec = [Spec("c", "k", max=1000)]
    for store in stores:
        name = uuid.uuid4().hex[:8]
        try:
            limiter = limiter_from_url(STORES[store].format(tmp=tmp, name=name))
        except Exception as exc:  # noqa: BLE001 - a store that is not running is skipped
            print(f"{store}: skipped ({exc})")
            continue
        started = time.perf_counter()
        for i in range(n):
            limiter.admit(Parcel(f"m{i}", "q", b"{}"), spec, time.time(), 30)
            limiter.release(f"m{i}", spec, time.time(), 30)
        each = (time.perf_counter() - started) / n
        limiter.close()
        _drop(store, name)
        print(f"limited message, {store}: {each * 1e6:.0f} us per task (admit + release), "
              f"{each * 1e9 / free_ns:,.0f}x the unlimited check")


def _drop(store: str, name: str) -> None:
    if store == "redis":
        import redis
        client = redis.Redis()
        keys = list(client.scan_iter(match=f"bench{name}:*"))
        if keys:
            client.delete(*keys)
        client.close()
    elif store == "postgres":
        import psycopg
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                             autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS bench{name} CASCADE")


def worker_round(tmp: Path, which: str, n: int) -> float:
    url = f"sqlite:///{tmp}/{which}-{uuid.uuid4().hex[:6]}.db"
    with broker_from_url(url) as broker:
        client = Client(broker)
        for _ in range(n):
            client.enqueue(Message(queue="bench", task=f"bench.{which}",
                                   headers=_headers(which)))
    env = {**os.environ, "CONVEYOR_BROKER_URL": url, "CONVEYOR_LOG_LEVEL": "INFO",
           "CONVEYOR_LOG_FORMAT": "json", "PYTHONPATH": f"{tmp}:{ROOT / 'src'}"}
    argv = [sys.executable, "-m", "conveyor.cli", "worker", "-Q", "bench", "-c", "2",
            "--app", "benchapp", "--burst", "--max-tasks-per-child", "100000"]
    done = subprocess.run(argv, env=env, cwd=tmp, check=True, capture_output=True, text=True)
    # from the first task's end to the last's: start-up and the burst's last check left out
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()
             if line.startswith("{")]
    ends = [line["at"] for line in lines if " succeeded in " in line.get("message", "")]
    assert len(ends) == n, (done.stdout + done.stderr)[-2000:]
    return (ends[-1] - ends[0]) / (n - 1)


def _headers(which: str) -> dict[str, str]:
    if which == "free":
        return {}
    import benchapp  # type: ignore[import-not-found]
    return dict(benchapp.limited.message(()).headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--stores", default="sqlite,redis,postgres")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        (tmp / "benchapp.py").write_text(APP)
        sys.path.insert(0, str(tmp))
        check_cost(args.stores.split(","), tmp, args.tasks)
        best = {"free": float("inf"), "limited": float("inf")}
        for _ in range(args.rounds):
            for which in ("free", "limited"):
                best[which] = min(best[which], worker_round(tmp, which, args.tasks))
        print(f"end to end, {args.tasks} no-op tasks on a worker (SQLite, 2 slots), best of "
              f"{args.rounds}: unlimited {best['free'] * 1000:.2f} ms per task, limited "
              f"{best['limited'] * 1000:.2f} ms per task; limited/unlimited = "
              f"{best['limited'] / best['free']:.2f}")


if __name__ == "__main__":
    main()
