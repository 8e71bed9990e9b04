#!/usr/bin/env python
"""What the failover-safe default costs on a Postgres with a synchronous standby.

usage: python benchmarks/pg_standby_bench.py [--n 2000]

Makes a primary and a synchronous streaming standby of its own (tests/integration/
pg_standby.py: initdb, pg_basebackup -R, private ports), then, through the two-host URL,
publishes N messages and drains them (claim + ack, one consumer, prefetch 1 and 16) twice:
with the default for several hosts (`ack_commit=sync`: claims and acks wait for the standby)
and with `ack_commit=async` (they do not: a failover may run those tasks again). Prints
messages/s for each. Everything it started is killed at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from conveyor.broker import from_url  # noqa: E402
from tests.integration.pg_standby import standby_pair  # noqa: E402


def rates(url: str, n: int, prefetch: int) -> tuple[float, float]:
    """(published/s, drained/s) for N messages on a queue of their own."""
    broker = from_url(url)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    body = b'{"v":1,"task":"noop"}'
    started = time.perf_counter()
    for _ in range(n):
        broker.publish(queue, body)
    published = n / (time.perf_counter() - started)
    done, started = 0, time.perf_counter()
    for delivery in broker.consume([queue], prefetch=prefetch, timeout=0.5):
        if delivery is None:
            break
        broker.ack(delivery)
        done += 1
        if done == n:
            break
    drained = done / (time.perf_counter() - started)
    broker.close()
    return published, drained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--n", type=int, default=2000)
    n = parser.parse_args().n
    pair = standby_pair()
    try:
        for commit in ("sync", "async"):
            for prefetch in (1, 16):
                url = f"{pair.url}?schema=bench_{commit}&ack_commit={commit}"
                published, drained = rates(url, n, prefetch)
                print(f"ack_commit={commit:5} prefetch={prefetch:2}: publish {published:6.0f}/s, "
                      f"claim+ack {drained:6.0f}/s ({n} messages)")
    finally:
        pair.close()


if __name__ == "__main__":
    main()
