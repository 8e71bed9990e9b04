#!/usr/bin/env python
"""Broker benchmark: publish, and publish+consume+ack, rates per transport.

usage: python benchmarks/broker_bench.py [TRANSPORT ...] [--n 20000] [--prefetch 32]
TRANSPORT: sqlite, redis, postgres, rabbitmq (default: all that answer).

For each transport it prints messages/s for: publishing N messages from one process; then
draining them (consume + ack) with 1 and with 2 consumer processes, from the moment the
consumers start until the last ack. Queues are unique per run and purged afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
import uuid
from typing import Any

from conveyor.broker import from_url

URLS = {
    "sqlite": "sqlite:///{tmp}/bench.db",
    "redis": "redis://127.0.0.1:6379/0?prefix=bench{tag}",
    "postgres": "postgresql://postgres@127.0.0.1:5432/postgres?schema=bench{tag}",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/%2F",
}


def publish(url: str, queue: str, n: int) -> float:
    broker = from_url(url)
    body = b'{"v":1,"task":"noop"}'
    started = time.perf_counter()
    for _ in range(n):
        broker.publish(queue, body)
    elapsed = time.perf_counter() - started
    broker.close()
    return n / elapsed


def _drain(url: str, queue: str, prefetch: int, start: Any, idle: float,
           done: Any, last: Any) -> None:
    broker = from_url(url)
    start.wait()
    for delivery in broker.consume([queue], prefetch=prefetch, timeout=idle):
        if delivery is None:
            break
        broker.ack(delivery)
        with done.get_lock():
            done.value += 1
            last.value = max(last.value, time.time())
    broker.close()


def drain(url: str, queue: str, n: int, consumers: int, prefetch: int) -> float:
    """Consumers count their own acks: no depth probe competes with them for the server."""
    start, done, last = mp.Event(), mp.Value("i", 0), mp.Value("d", 0.0)
    procs = [mp.Process(target=_drain, args=(url, queue, prefetch, start, 0.5, done, last))
             for _ in range(consumers)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # connections up before the clock starts
    started = time.time()
    start.set()
    for p in procs:
        p.join()
    if done.value < n:
        raise RuntimeError(f"only {done.value} of {n} messages were consumed")
    return n / (last.value - started)


def bench(name: str, n: int, prefetch: int) -> None:
    tmp = tempfile.mkdtemp()
    tag = uuid.uuid4().hex[:8]
    url = URLS[name].format(tmp=tmp, tag=tag)
    queue = f"bench-{tag}"
    rates = {"publish": publish(url, queue, n)}
    rates["drain x1"] = drain(url, queue, n, 1, prefetch)
    publish(url, queue, n)
    rates["drain x2"] = drain(url, queue, n, 2, prefetch)
    cleanup = from_url(url)
    cleanup.purge(queue)
    cleanup.close()
    print(f"{name:9} " + "  ".join(f"{k}: {v:8,.0f}/s" for k, v in rates.items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("transports", nargs="*", default=list(URLS))
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--prefetch", type=int, default=32)
    args = parser.parse_args()
    print(f"n={args.n} prefetch={args.prefetch}")
    for name in args.transports:
        try:
            bench(name, args.n, args.prefetch)
        except Exception as exc:  # noqa: BLE001 - one transport down must not stop the rest
            print(f"{name:9} failed: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
