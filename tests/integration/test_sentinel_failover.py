"""kill -9 of the Redis primary mid-run, behind redis+sentinel://: two real `conveyor worker`
processes and two producers follow the replica the Sentinels promote.

Redis replicates asynchronously: a publish the primary acknowledged but had not yet sent to
its replica when it died is gone after the failover. This test counts such losses (messages
a producer saw acknowledged that never ran) in the default mode, where they are possible
but not certain (on loopback the replica is usually a fraction of a millisecond behind, so
a run often loses none), and asserts none in the durable mode (`?wait_replicas=1`), where a
publish returns only once the replica has it. What either mode guarantees and is asserted:
every message acknowledged after the promotion runs, the workers keep consuming, and the
fleet resumes. The figures are printed (`-s`); benchmarks/sentinel_bench.py measures the
durable mode's cost.

The failed node is started again once the replica is promoted (an operator's restart): the
Sentinels make it the new primary's replica, which the durable mode's WAIT needs.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.errors import BrokerError
from tests.integration.sentinel_servers import SentinelCluster, deployment
from tests.integration.workerkit import finish, start_worker, stop, task_message
from tests.support import wait_for

# one deployment for both modes: the module's tests stay in one xdist worker
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.xdist_group("sentinel-failover")]

TASKS = 600
PRODUCERS = 2
#: Published (acknowledged) before the kill: the rest are published during and after it.
KILL_AFTER = TASKS // 3
#: A short lease, so a delivery whose ack died with the primary comes back soon.
LEASE = 5


@pytest.fixture(scope="module")
def sentinel_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    yield from deployment(tmp_path_factory)


@dataclass
class Producer:
    """Publishes its share of `t.record` tasks, each until a publish of it is acknowledged
    (a failed one is published again: a duplicate is possible, never a loss)."""

    url: str
    queue: str
    path: Path
    tokens: list[str]
    #: token -> (monotonic time the acknowledged publish started, and returned)
    acked: dict[str, tuple[float, float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def run(self) -> None:
        with from_url(self.url) as broker:
            client = Client(broker)
            for token in self.tokens:
                while True:
                    started = time.monotonic()
                    try:
                        client.enqueue(task_message("t.record", self.queue, str(self.path),
                                                    token))
                    except BrokerError as exc:
                        self.errors[type(exc).__name__] += 1
                        continue
                    self.acked[token] = (started, time.monotonic())
                    break
                time.sleep(0.015)   # a steady stream, so the kill lands mid-publishing


def ran(path: Path) -> Counter[str]:
    """How many times each token's task finished."""
    if not path.exists():
        return Counter()
    return Counter(line.split()[1] for line in path.read_text().splitlines()
                   if line.startswith("done ") and len(line.split()) == 2)


@dataclass
class Failover:
    """When (monotonic) the primary was killed, a replica promoted, the old one back."""

    killed: float
    promoted: float
    revived: float
    done_at_kill: int


def fail_over(cluster: SentinelCluster, path: Path) -> Failover:
    """kill -9 of the primary; wait for the promotion, then start the old node again."""
    cluster.kill_primary()
    killed = time.monotonic()
    done = sum(ran(path).values())
    cluster.promoted()
    promoted = time.monotonic()
    cluster.revive()
    return Failover(killed, promoted, time.monotonic(), done)


def drain(url: str, queue: str, path: Path, needed: list[str]) -> None:
    """Wait until the queue is empty (nothing ready, delayed or in flight) and every token
    in `needed` has run."""
    with from_url(url) as broker:
        def drained() -> bool:
            depth = broker.depth(queue)
            return depth.ready + depth.in_flight + depth.delayed == 0 and \
                set(needed) <= set(ran(path))
        wait_for(drained, 90, "the workers to run everything left on the promoted primary",
                 detail=lambda: f"{broker.depth(queue)}; done {len(ran(path))}/{TASKS}")


def cleanup(cluster: SentinelCluster, workers: list[subprocess.Popen[str]],
            threads: list[threading.Thread], prefix: str) -> None:
    """Stop the workers (every one, whatever happened), heal the deployment, drop our keys."""
    for w in workers:
        stop(w)
    for w in workers:
        try:
            finish(w, 30)
        except AssertionError:
            pass
    for t in threads:
        t.join(5)
    if cluster.killed is not None:
        cluster.revive()
    with cluster.primary().client() as c:
        for key in c.scan_iter(match=f"{prefix}:*", count=1000):
            c.delete(key)


@pytest.mark.parametrize("mode", ["async", "durable"])
def test_kill_9_of_the_primary_mid_run(sentinel_cluster: SentinelCluster, unique: str,
                                       tmp_path: Path, mode: str) -> None:
    url = f"{sentinel_cluster.url}?prefix={unique}"
    if mode == "durable":
        url += "&wait_replicas=1&wait_timeout_ms=1000"
    queue, path = unique, tmp_path / "record"
    workers = [start_worker(url, queue, f"--lease={LEASE}", "--concurrency=4", burst=False)
               for _ in range(2)]
    tokens = [f"{unique}-{i}" for i in range(TASKS)]
    producers = [Producer(url, queue, path, tokens[i::PRODUCERS]) for i in range(PRODUCERS)]
    threads = [threading.Thread(target=p.run, daemon=True) for p in producers]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: sum(len(p.acked) for p in producers) >= KILL_AFTER
                 and len(ran(path)) >= 20, 60,
                 "the producers to publish a third of the tasks, and the workers to run some")
        at = fail_over(sentinel_cluster, path)
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a producer never finished"
        acked = {k: v for p in producers for k, v in p.acked.items()}
        assert len(acked) == TASKS
        after = [k for k, (start, _) in acked.items() if start > at.promoted]
        drain(url, queue, path, after)
        runs = ran(path)
        lost = sorted(set(acked) - set(runs))
        resumed = min(end for start, end in acked.values() if start > at.killed) - at.killed
        print(f"\n[sentinel failover, {mode}] {TASKS} tasks, kill -9 after {KILL_AFTER} "
              f"published ({at.done_at_kill} done): promoted in "
              f"{at.promoted - at.killed:.1f} s, old primary back as replica in "
              f"{at.revived - at.promoted:.1f} s; first publish acknowledged {resumed:.1f} s "
              f"after the kill; lost (acknowledged, never ran) {len(lost)}; duplicates "
              f"{sum(n - 1 for n in runs.values() if n > 1)}; publish errors retried "
              f"{dict(sum((p.errors for p in producers), Counter()))}")
        for w in workers:
            assert w.poll() is None, f"a worker exited:\n{finish(w, 5)}"
        # Guaranteed in both modes: what the promoted primary acknowledged is never lost,
        # and only what was acknowledged before the promotion (in the replication lag at
        # the kill) can be.
        assert not set(lost) & set(after)
        if mode == "durable":
            assert lost == [], f"the durable mode lost {len(lost)} acknowledged messages"
    finally:
        cleanup(sentinel_cluster, workers, threads, unique)
