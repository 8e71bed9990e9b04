"""What the Redis durable mode costs: publish and claim+ack latency through redis+sentinel://,
asynchronous (the default) against `?wait_replicas=1` (a WAIT for the replica after each
publish and ack), on a primary, a replica and three Sentinels of its own on loopback (the
tests' deployment, tests/integration/sentinel_servers.py), killed at exit.

    python benchmarks/sentinel_bench.py [--messages 2000] [--rounds 2]

Prints per mode: publishes/s, p50 and p99 of one publish, and claim+ack round trips/s; then
the durable/async ratios. Rounds alternate the modes so load drifts hit both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conveyor.broker import from_url  # noqa: E402
from tests.integration.sentinel_servers import start_cluster  # noqa: E402

MODES = {"async": "", "durable": "&wait_replicas=1&wait_timeout_ms=1000"}


def one_round(url: str, messages: int) -> dict[str, float]:
    """Publish `messages` one by one, then claim and ack each: latencies and rates."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    with from_url(url) as broker:
        latencies = []
        started = time.perf_counter()
        for _ in range(messages):
            t = time.perf_counter()
            broker.publish(queue, b"x" * 200)
            latencies.append(time.perf_counter() - t)
        published = time.perf_counter() - started
        started, acked = time.perf_counter(), 0
        for delivery in broker.consume([queue], prefetch=1, timeout=1):
            if delivery is None:
                break
            broker.ack(delivery)
            acked += 1
            if acked == messages:
                break
        consumed = time.perf_counter() - started
        broker.purge(queue)
    latencies.sort()
    return {"publish_per_s": messages / published,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
            "claim_ack_per_s": acked / consumed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cluster = start_cluster(Path(tempfile.mkdtemp(prefix="sentinel-bench-")))
    try:
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, options in MODES.items():
                url = f"{cluster.url}?prefix=bench{options}"
                results[mode].append(one_round(url, args.messages))
        best = {mode: {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                for mode, rounds in results.items()}
        for mode, figures in best.items():
            print(f"{mode:8} publish {figures['publish_per_s']:7.0f}/s  p50 "
                  f"{figures['p50_ms']:.3f} ms  p99 {figures['p99_ms']:.3f} ms  claim+ack "
                  f"{figures['claim_ack_per_s']:7.0f}/s")
        a, d = best["async"], best["durable"]
        print(f"durable/async: publish rate {d['publish_per_s'] / a['publish_per_s']:.2f}x, "
              f"p50 latency {d['p50_ms'] / a['p50_ms']:.2f}x, claim+ack rate "
              f"{d['claim_ack_per_s'] / a['claim_ack_per_s']:.2f}x")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
