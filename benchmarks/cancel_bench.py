#!/usr/bin/env python3
"""Cancel's cost on the claim path: the drain of no-op tasks before and after the feature.

    .venv/bin/python benchmarks/cancel_bench.py --old-src PATH [--tasks 3000] [--rounds 2]
        [--broker redis://127.0.0.1:6379/0]

`--tasks` no-op tasks through a real `conveyor worker --burst` (2 slots, runners reused so
the supervisor's own path dominates), on this checkout's src and on `--old-src` (a checkout
from before cancel, or a copy of this src whose worker/cli.py passes `cancels=None`: the
same code without the watch), rounds interleaved so a busy machine skews both alike; and
with `--cancelled` ids recorded as cancelled first (the worker keeps them in memory: the
lookup is a set's). Each round's queue keys are deleted after it (Redis).
Tasks a second from the first task's end to the last's; the best round of each side.
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
from conveyor.broker import Publication
from conveyor.broker import from_url as broker_from_url
from conveyor.control import CANCEL_TTL
from conveyor.locations import store_urls
from conveyor.message import Codec, Message

ROOT = Path(__file__).parents[1]
APP = '''
from conveyor import task

@task(name="bench.noop", max_retries=0, store_result=False)
def noop() -> None:
    return None
'''


def drain(tmp: Path, src: Path, broker: str, n: int, cancelled: int) -> float:
    """Tasks a second for one drain of `n` no-op tasks by a worker running `src`."""
    name = f"cb{uuid.uuid4().hex[:8]}"
    url = f"{broker}?prefix={name}" if broker.startswith("redis") else \
        broker.replace("{tmp}", str(tmp)).replace("{name}", name)
    queue = f"bench-{name}"
    producer = broker_from_url(url)
    codec = Codec()
    producer.publish_many([Publication(queue, codec.encode(Message(queue=queue,
                                                                   task="bench.noop")))
                           for _ in range(n)])
    producer.close()
    if cancelled:
        store = limits.from_url(store_urls(url, f"sqlite:///{tmp}/state.db").limits)
        for i in range(cancelled):
            store.cancel(f"not-one-of-these-{i}", time.time(), CANCEL_TTL)
        store.close()
    env = {**os.environ, "CONVEYOR_BROKER_URL": url, "CONVEYOR_LOG_LEVEL": "INFO",
           "CONVEYOR_STATE_URL": f"sqlite:///{tmp}/state.db",
           "CONVEYOR_LOG_FORMAT": "json", "PYTHONPATH": f"{tmp}:{src}"}
    argv = [sys.executable, "-m", "conveyor.cli", "worker", "-Q", queue, "-c", "2",
            "--app", "benchapp", "--burst", "--max-tasks-per-child", "100000"]
    done = subprocess.run(argv, env=env, cwd=tmp, check=True, capture_output=True, text=True)
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()
             if line.startswith("{")]
    ends = [line["at"] for line in lines if " succeeded in " in line.get("message", "")]
    assert len(ends) == n, (done.stdout + done.stderr)[-2000:]
    _forget(url, name)
    return (n - 1) / (ends[-1] - ends[0])


def _forget(url: str, name: str) -> None:
    """Delete what a Redis round left under its prefix (its records and emptied queue)."""
    if not url.startswith("redis"):
        return
    import redis
    client = redis.Redis.from_url(url.split("?", 1)[0])
    for key in client.scan_iter(match=f"{name}:*"):
        client.delete(key)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cancelled", type=int, default=1000,
                        help="cancel records in the store for other ids (after only)")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--old-src", type=Path, required=True,
                        help="src/ of a checkout from before cancel")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        (tmp / "benchapp.py").write_text(APP)
        sides = {"before": (args.old_src, 0), "after": (ROOT / "src", 0),
                 f"after, {args.cancelled} cancel records": (ROOT / "src", args.cancelled)}
        best = dict.fromkeys(sides, 0.0)
        for _ in range(args.rounds):
            for side, (src, cancelled) in sides.items():
                rate = drain(tmp, src, args.broker, args.tasks, cancelled)
                print(f"  {side}: {rate:.0f} tasks/s", flush=True)
                best[side] = max(best[side], rate)
        base = best["before"]
        print(f"{args.tasks} no-op tasks, 2 slots, runners reused, {args.broker}, best of "
              f"{args.rounds}: " + "; ".join(f"{side} {rate:.0f}/s ({rate / base:.2f}x)"
                                              for side, rate in best.items()))


if __name__ == "__main__":
    main()
