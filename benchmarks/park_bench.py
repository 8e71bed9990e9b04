#!/usr/bin/env python3
"""How fast workers park a backlog of a full key, per backend, old code against new.

    .venv/bin/python benchmarks/park_bench.py [--messages 1000] [--workers 2]
        [--backends sqlite,redis,postgres,rabbitmq] [--rounds 2] --old /tmp/old/src

Per round and backend: the key `tenant:a` (max 2) is made full by two tokens taken straight
in the limiter, `--messages` tasks of that key are published, then `--workers` real
`conveyor worker` processes (1 slot each) start; the figure is the time from the first
message parked until the limiter holds every one of them parked, and the CPU the workers
used meanwhile (their /proc times), per parked message. Each round runs the `--old` source
tree (before batch parking: one park per claim) and this tree's, interleaved, so a busy
machine skews both alike; the load average is printed with every line.

The limiter's store is read through this tree's code: compare Redis only against a tree
with the same key layout (6d87df9 moved it under `<prefix>:{limits}:`; an older worker's
parks are then not seen, and the round stops after 300 s saying so).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from conveyor import limits  # noqa: E402
from conveyor.broker import Publication, from_url  # noqa: E402
from conveyor.flow import Spec  # noqa: E402
from conveyor.limits import Parcel  # noqa: E402
from conveyor.locations import store_urls  # noqa: E402
from conveyor.message import Codec  # noqa: E402
from tests import flow_tasks  # noqa: E402
from tests.conftest import (  # noqa: E402
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    clean_transport,
    drop_postgres_schema,
)

APP = "tests.flow_tasks"


def urls(backend: str, tmp: Path, name: str) -> tuple[str, dict[str, str]]:
    """(broker URL, extra worker settings) for one round."""
    if backend == "sqlite":
        return f"sqlite:///{tmp}/broker.db", {}
    if backend == "redis":
        return f"{REDIS_URL}?prefix={name}", {}
    if backend == "postgres":
        return f"{POSTGRES_URL}?schema={name}", {}
    return RABBITMQ_URL, {"CONVEYOR_STATE_URL": f"{POSTGRES_URL}?schema={name}"}


def one_round(backend: str, src: str, n: int, workers: int) -> tuple[float, float]:
    """(seconds to park `n`, worker CPU seconds per parked message)."""
    name = "park" + uuid.uuid4().hex[:10]
    with tempfile.TemporaryDirectory() as tmp:
        url, extra = urls(backend, Path(tmp), name)
        store = limits.from_url(store_urls(url, extra.get("CONVEYOR_STATE_URL", "")).limits)
        spec = [Spec("c", "tenant:a", max=2)]
        for holder in ("hold-1", "hold-2"):
            assert store.admit(Parcel(holder, name, b"{}"), spec, time.time(), 600).granted
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        env.update({"CONVEYOR_BROKER_URL": url, "PYTHONPATH": f"{src}:{ROOT}",
                    "CONVEYOR_LOG_LEVEL": "WARNING", **extra})
        codec, ledger = Codec(), str(Path(tmp) / "ledger")
        with from_url(url) as broker:
            broker.publish_many([Publication(name, codec.encode(
                flow_tasks.tenant_job.message(("a", ledger), queue=name))) for _ in range(n)])
        procs = [subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "worker", f"--queues={name}",
             "--concurrency=1", f"--app={APP}", "--drain-timeout=0"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(workers)]
        try:
            deadline = time.monotonic() + 300
            while (parked := _waiting(store)) < 1 and time.monotonic() < deadline:
                time.sleep(0.002)
            start, cpu0 = time.monotonic(), _cpu(procs)
            while (parked := _waiting(store)) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            if parked < n:
                raise SystemExit(f"{backend}: {parked} of {n} parked within 300 s")
            seconds, cpu = time.monotonic() - start, _cpu(procs) - cpu0
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(60)
            store.close()
            if backend == "rabbitmq":
                clean_transport("rabbitmq", name)
                drop_postgres_schema(name)
            elif backend != "sqlite":
                clean_transport(backend, name)
        return seconds, cpu / (n - 1)


def _cpu(procs: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds (user + system) the live worker processes used so far (/proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for proc in procs:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def _waiting(store: limits.Limiter) -> int:
    return sum(u.waiting for u in store.usage(time.time()) if u.key == "tenant:a")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backends", default="sqlite,redis,postgres,rabbitmq")
    parser.add_argument("--old", required=True,
                        help="the source tree to compare, e.g. the parent of the batch-park "
                             "commit: git archive ce590dd~1 src | tar -x -C /tmp/old")
    args = parser.parse_args()
    trees = {"old": args.old, "new": str(ROOT / "src")}
    print(f"{args.messages} messages of a full key, {args.workers} workers of 1 slot; "
          "seconds until all are parked (parks/s), worker CPU per park")
    for r in range(args.rounds):
        for backend in args.backends.split(","):
            line = []
            for which, src in trees.items():
                seconds, cpu = one_round(backend, src, args.messages, args.workers)
                line.append(f"{which} {seconds:6.2f} s ({args.messages / seconds:6.0f}/s, "
                            f"{cpu * 1e3:5.2f} ms CPU)")
            load = os.getloadavg()[0]
            print(f"round {r + 1} {backend:9} " + " | ".join(line) + f"  load {load:.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
