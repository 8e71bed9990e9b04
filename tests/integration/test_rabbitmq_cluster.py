"""Conveyor on a 3-node RabbitMQ 3.10 cluster of the test's own (rabbit_cluster.py), through a
`kill -9` of a node mid-run (issue 31).

Each scenario publishes TASKS `t.mark` tasks (each run appends its token and the time to a
file) and runs them with 2 real `conveyor worker` processes, connected by a multi-host URL
that names a node other than the work queue's quorum leader first. Half the tasks are
queued before the workers start (so they are consuming a backlog at the kill); the other
half is published while they run, in batches, each confirmed before the next. Mid-run one
node is killed:

* the node the workers and the publisher are connected to (not the leader): they must
  reconnect to another node of the URL;
* the work queue's quorum leader (the workers' connections survive): the queue must elect a
  new leader among the two survivors.

Both check: 0 lost (every publish confirmed before the kill, and every other), duplicates only
among tasks in flight at the kill (at most what the workers held: slots plus read-ahead) or
in the publish batch that spanned it (sent again when its confirm was lost), and consuming
again within RESUME_LIMIT s of the kill (measured: the first run of a task delivered after
the kill, see `measure`). The figures are printed (`-s`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.broker import from_url
from conveyor.client import Client
from tests.integration.rabbit_cluster import (
    Cluster,
    cluster_available,
    rabbit_cluster,
    wait_running,
)
from tests.integration.workerkit import start_worker, task_message, worker_env
from tests.support import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.xdist_group("rabbitmq-cluster")]

TASKS = 5000
#: Published before the workers start: the backlog they consume at the kill.
FIRST = 2500
#: The rest is published once START_PUBLISHING runs are recorded, in batches of BATCH, each
#: confirmed before the next, PAUSE s apart; the kill comes at KILL_AFTER runs, with
#: publishing and consuming both under way.
BATCH = 100
PAUSE = 0.05
START_PUBLISHING = 500
KILL_AFTER = 1000
#: ... or at this batch if the workers are slower (a loaded machine): publishing is under way.
KILL_BATCH = 12
WORKERS = 2
CONCURRENCY = 4
READ_AHEAD = 8
#: What the workers may hold unacked at once: RabbitMQ's prefetch is slots plus read-ahead.
HELD = WORKERS * (CONCURRENCY + READ_AHEAD)
RESUME_LIMIT = 15.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not cluster_available():
        if os.environ.get("CI") == "true":
            pytest.fail("RabbitMQ server scripts (/usr/lib/rabbitmq/bin) are missing in CI")
        pytest.skip("RabbitMQ server scripts (/usr/lib/rabbitmq/bin) are not installed here")
    with rabbit_cluster(uuid.uuid4().hex[:8]) as started:
        print(f"\n3-node RabbitMQ cluster formed in {started.started_in:.1f} s")
        yield started


class Publisher(threading.Thread):
    """Publishes tokens [start_at, stop_at) in batches of BATCH, each `publish_many`
    confirmed before the next; notes when each batch began and returned."""

    def __init__(self, url: str, queue: str, log: Path, start_at: int, stop_at: int,
                 pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.pause = pause
        self.url, self.queue, self.log = url, queue, log
        self.start_at, self.stop_at = start_at, stop_at
        self.batches: list[tuple[float, float, list[str]]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            client = Client(from_url(self.url))
            for first in range(self.start_at, self.stop_at, BATCH):
                tokens = [f"m{n}" for n in range(first, min(first + BATCH, self.stop_at))]
                began = time.monotonic()
                client.broker.publish_many([client.publication(
                    task_message("t.mark", self.queue, str(self.log), token))
                    for token in tokens])
                self.batches.append((began, time.monotonic(), tokens))
                time.sleep(self.pause)
            client.broker.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def runs(log: Path) -> list[tuple[str, float]]:
    """(token, when) of every run recorded so far (a line cut short is skipped)."""
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        token, _, at = line.partition(" ")
        try:
            found.append((token, float(at)))
        except ValueError:
            continue
    return found


class Workers:
    """WORKERS real `conveyor worker` processes on `url`, their output read as it comes (a
    full pipe would stall them); `stop()` stops them (SIGTERM) and keeps their output."""

    def __init__(self, url: str, queue: str, tmp_path: Path) -> None:
        env = worker_env(url, CONVEYOR_STATE_URL=f"sqlite:///{tmp_path}/state.db",
                         CONVEYOR_LOG_LEVEL="INFO")
        self.procs = [start_worker(url, queue, f"--concurrency={CONCURRENCY}",
                                   f"--read-ahead={READ_AHEAD}", "--max-tasks-per-child=1000",
                                   burst=False, env=env) for _ in range(WORKERS)]
        self.lines: list[list[str]] = [[] for _ in self.procs]
        self.readers = [threading.Thread(target=lines.extend, args=(proc.stdout or [],),
                                         daemon=True)
                        for proc, lines in zip(self.procs, self.lines, strict=True)]
        for reader in self.readers:
            reader.start()
        self.outputs: list[str] = []

    def alive(self) -> bool:
        """True while every worker runs (a worker that exited fails a wait at once)."""
        assert all(proc.poll() is None for proc in self.procs), "a worker exited"
        return True

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, lines, reader in zip(self.procs, self.lines, self.readers, strict=True):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
            self.outputs.append("".join(lines))

    def check_clean_exit(self) -> None:
        for proc, out in zip(self.procs, self.outputs, strict=True):
            assert proc.returncode == 0 and "Traceback" not in out, out[-4000:]


@dataclass
class Figures:
    """What a scenario measured: seconds from the kill to consuming again, the tokens run
    twice, those in flight at the kill or in a publish batch that spanned it, those lost."""

    resumed: float
    duplicates: set[str]
    in_flight: set[str]
    spanning: set[str]
    lost: set[str]
    confirmed_before: int
    published_again: float | None  # from the kill to the first publish confirmed after it

    def say(self, what: str, seconds: float) -> None:
        print(f"\nkill -9 of {what}: consuming again {self.resumed:.2f} s after; "
              f"{TASKS - len(self.lost)}/{TASKS} run, {len(self.lost)} lost, "
              f"{len(self.duplicates)} duplicate(s), {len(self.duplicates & self.spanning)} "
              f"of them of the publish batch that spanned the kill; {self.confirmed_before} "
              f"publishes confirmed before the kill, the first after it "
              f"{'(none)' if self.published_again is None else f'{self.published_again:.2f} s'}"
              f" after; scenario {seconds:.1f} s")


def measure(log: Path, killed_at: float, batches: list[tuple[float, float, list[str]]]
            ) -> Figures:
    """The figures of a scenario from its runs and its publish batches."""
    recorded = runs(log)
    counts = Counter(token for token, _ in recorded)
    # Consuming again: the first run of a delivery made after the kill. The queue is FIFO
    # (tokens go out in publish order) and the workers held at most HELD deliveries at the
    # kill, so a token more than HELD past the last one run before it was delivered after.
    last_before = max(int(token[1:]) for token, at in recorded if at < killed_at)
    resumed_at = min(at for token, at in recorded
                     if at > killed_at and int(token[1:]) > last_before + HELD)
    first_run: dict[str, float] = {}
    for token, at in recorded:
        first_run.setdefault(token, at)
    # In flight at the kill: delivered on the lost connections and not acked yet, so first
    # run before consuming resumed (acks are coalesced and may wait behind a slower task, so
    # no time window says which; `check` bounds their number by what workers may hold).
    in_flight = {token for token, at in first_run.items() if at < resumed_at}
    spanning = {token for start, end, tokens in batches for token in tokens
                if start <= killed_at < end}
    confirmed_before = {token for _, end, tokens in batches for token in tokens
                        if end < killed_at}
    lost = {f"m{n}" for n in range(TASKS)} - set(counts)
    confirmed_after = min((end - killed_at for _, end, _ in batches if end > killed_at),
                          default=None)
    return Figures(resumed_at - killed_at, {t for t, c in counts.items() if c > 1}, in_flight,
                   spanning, lost | (confirmed_before - set(counts)), len(confirmed_before),
                   confirmed_after)


def fail_over(cluster: Cluster, victim: str, tmp_path: Path) -> Figures:
    """Run a scenario (see the module docstring); `victim` is "connected" or "leader"."""
    began = time.monotonic()
    restart_killed(cluster)
    queue, log = f"q-{uuid.uuid4().hex[:12]}", tmp_path / "runs.log"
    # The first half declares the queue through node 2: its quorum leader goes there
    # (client-local placement), and the workers connect elsewhere. It is the backlog the
    # workers are consuming at the kill (so the pause measured is theirs, not a wait for work).
    seed = Publisher(cluster.url([1, 2, 0]), queue, log, 0, FIRST)
    seed.run()
    assert seed.error is None, seed.error
    info = cluster.queue(queue)
    leader = cluster.node_named(info["leader"])
    assert len(info["members"]) == len(cluster.nodes), info["members"]  # replicated on all
    home = next(n for n, node in enumerate(cluster.nodes) if node is not leader)
    url = cluster.url([home, *[n for n in range(len(cluster.nodes)) if n != home]])
    target = cluster.nodes[home] if victim == "connected" else leader
    workers = Workers(url, queue, tmp_path)
    publisher = Publisher(url, queue, log, FIRST, TASKS, pause=PAUSE)
    try:
        wait_for(lambda: workers.alive() and len(runs(log)) >= START_PUBLISHING, 120,
                 f"{START_PUBLISHING} runs")
        publisher.start()
        wait_for(lambda: workers.alive() and (publisher.error or len(publisher.batches) >= 2
                                              and (len(runs(log)) >= KILL_AFTER
                                                   or len(publisher.batches) >= KILL_BATCH)),
                 120, f"{KILL_AFTER} runs or {KILL_BATCH} batches published")
        killed_at = time.monotonic()
        cluster.kill(target)
        publisher.join(timeout=120)
        assert publisher.error is None and not publisher.is_alive(), publisher.error
        expected = {f"m{n}" for n in range(TASKS)}
        wait_for(lambda: workers.alive() and expected <= {token for token, _ in runs(log)},
                 120, "every task run", detail=lambda: f"{len(runs(log))} runs")
        check_depth(url, queue, cluster.nodes[home].management_url,
                    dead_first=target is cluster.nodes[home])
        cluster.start(target)  # boots meanwhile, for the next scenario (restart_killed)
    finally:
        workers.stop()
        if sys.exc_info()[0] is not None:
            print("".join(f"--- a worker's output:\n{out[-4000:]}" for out in workers.outputs))
    figures = measure(log, killed_at, seed.batches + publisher.batches)
    figures.say(f"the {victim} node {target.name}", time.monotonic() - began)
    for n, out in enumerate(workers.outputs):  # how each worker saw it
        print("".join(f"  worker {n + 1}: {line}" for line in out.splitlines(keepends=True)
                      if "conveyor.broker.rabbitmq" in line and "consumer timeout" not in line))
    workers.check_clean_exit()
    for out in workers.outputs:  # connected to `home` first (and, if it was killed, moved)
        assert f"connected to RabbitMQ node {cluster.nodes[home].url} (1 of 3" in out, out
    return figures


def check_depth(url: str, queue: str, first: str, dead_first: bool) -> None:
    """`depth` through the URL the workers use: its management API list starts with
    `first`, dead if its node was killed (`dead_first`): then the next that answers."""
    broker = from_url(url)
    try:
        depth = broker.depth(queue)
        api = broker._mgmt  # type: ignore[attr-defined]
        asked = api.base
    finally:
        broker.close()
    print(f"depth of {queue}: {depth}; management API asked: {asked} (listed first: {first})")
    assert depth.ready == 0 and depth.dead == 0, depth
    assert (asked != first) == dead_first, (asked, first)


def restart_killed(cluster: Cluster) -> None:
    """Start again any node an earlier scenario killed (and did not start again), and wait
    for all to run."""
    for node in cluster.nodes:
        if node.proc is None:
            cluster.start(node)
    for node in cluster.nodes:
        cluster.wait_up(node)
    wait_running(cluster, len(cluster.nodes))


def check(figures: Figures) -> None:
    assert not figures.lost, sorted(figures.lost)  # confirmed before the kill or not
    unexplained = figures.duplicates - figures.in_flight - figures.spanning
    assert not unexplained, sorted(unexplained)
    # Only what workers held at the kill (slots plus read-ahead) may run twice, and a batch.
    assert len(figures.duplicates - figures.spanning) <= HELD, sorted(figures.duplicates)
    assert figures.resumed < RESUME_LIMIT, figures.resumed


@pytest.mark.timeout(300)
def test_kill_of_the_node_the_workers_are_connected_to(cluster: Cluster,
                                                       tmp_path: Path) -> None:
    check(fail_over(cluster, "connected", tmp_path))


@pytest.mark.timeout(300)
def test_kill_of_the_work_queues_quorum_leader(cluster: Cluster, tmp_path: Path) -> None:
    check(fail_over(cluster, "leader", tmp_path))

