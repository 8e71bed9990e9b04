"""A SIGKILLed worker's runners die with it, and its messages run again only after that.

Real workers on every native broker run `t.ledger`, which appends its pid and a
CLOCK_MONOTONIC stamp to a ledger every millisecond; a standby worker takes the message over
when the one running it is SIGKILLed. The bounds here are generous (a loaded machine):
benchmarks/orphan_bench.py measures the real figures.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.broker import Broker
from conveyor.message import Message
from tests.conftest import clean_transport, require_service
from tests.contract.conftest import TRANSPORTS
from tests.integration.workerkit import (
    ROOT,
    enqueue,
    finish,
    open_broker,
    start_worker,
    stop,
    task_message,
    worker_env,
)
from tests.support import wait_for

pytestmark = pytest.mark.slow

#: kill -> runner gone, at most (the benchmark's p99 is a few milliseconds)
GONE_WITHIN = 1.0


@pytest.fixture(params=["sqlite", "postgres", "redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    service, make_url = TRANSPORTS[request.param]
    if service:
        require_service(service)
    yield make_url(tmp_path, unique)
    clean_transport(request.param, unique)


class Ledger:
    """One `t.ledger` message's runs: who wrote when."""

    def __init__(self, tmp: Path) -> None:
        self.path, self.stop = tmp / "ledger", tmp / "stop"
        self.path.touch()

    def message(self, queue: str) -> Message:
        return task_message("t.ledger", queue, str(self.path), str(self.stop), 120)

    def lines(self) -> list[tuple[int, int]]:
        return [(int(pid), int(stamp)) for pid, stamp in
                (line.split() for line in self.path.read_text().splitlines()
                 if len(line.split()) == 2)]

    def runner(self, besides: int = 0, timeout: float = 60) -> int:
        """The pid of the first run other than `besides`, once it has written."""
        return int(wait_for(lambda: next((pid for pid, _ in self.lines() if pid != besides),
                                         None), timeout, "a run of the ledger task"))

    def first(self, pid: int) -> int:
        return min(stamp for p, stamp in self.lines() if p == pid)

    def last(self, pid: int) -> int:
        return max(stamp for p, stamp in self.lines() if p == pid)


def consuming(worker: subprocess.Popen[str]) -> str:
    """Read the worker's output until it says it consumes (pytest's timeout bounds this)."""
    assert worker.stdout is not None
    seen = []
    for line in worker.stdout:
        seen.append(line)
        if " consuming " in line:
            return "".join(seen)
    raise AssertionError("the worker exited before consuming:\n" + "".join(seen))


def kill_and_time(worker: subprocess.Popen[str], runner: int) -> tuple[int, float]:
    """SIGKILL the worker: (the kill's CLOCK_MONOTONIC ns, seconds until `runner` exited)."""
    pidfd = os.pidfd_open(runner)
    try:
        killed = time.monotonic_ns()
        worker.kill()
        ready = select.select([pidfd], [], [], 30)[0]
        gone = (time.monotonic_ns() - killed) / 1e9
    finally:
        os.close(pidfd)
    assert ready, f"runner {runner} still alive 30 s after its worker's SIGKILL"
    return killed, gone


@dataclass
class Scene:
    """A worker running `t.ledger` (its runner: `orphan`) and a standby consuming."""

    ledger: Ledger
    first: subprocess.Popen[str]
    standby: subprocess.Popen[str]
    orphan: int


@contextmanager
def running(url: str, tmp_path: Path, unique: str) -> Iterator[Scene]:
    broker = open_broker(url)
    ledger, queue = Ledger(tmp_path), f"d-{unique}"
    workers = [start_worker(url, queue, "--concurrency=1", burst=False)]
    try:
        enqueue(broker, ledger.message(queue))
        orphan = ledger.runner()
        workers.append(start_worker(url, queue, "--concurrency=1", burst=False))
        consuming(workers[1])
        yield Scene(ledger, workers[0], workers[1], orphan)
    finally:
        _stop_all(ledger, workers, broker, queue)


def test_a_killed_workers_runner_dies_at_once_and_runs_again_only_after(
        broker_url: str, unique: str, tmp_path: Path) -> None:
    with running(broker_url, tmp_path, unique) as scene:
        ledger, orphan = scene.ledger, scene.orphan
        killed, gone = kill_and_time(scene.first, orphan)
        again = ledger.runner(besides=orphan)
        assert gone < GONE_WITHIN, f"runner {orphan} outlived its worker by {gone:.3f} s"
        assert (ledger.last(orphan) - killed) / 1e9 < GONE_WITHIN
        assert ledger.first(again) > ledger.last(orphan), (
            f"the redelivered run started {(ledger.last(orphan) - ledger.first(again)) / 1e6:.1f}"
            " ms before the killed worker's runner last wrote")


@pytest.mark.parametrize("transport", ["rabbitmq", "kombu+amqp"])
def test_amqp_redelivers_only_once_the_runners_fork_server_is_gone(
        transport: str, unique: str, tmp_path: Path) -> None:
    """The connection whose close redelivers at once is held by the zygote, which exits only
    after its lanes, and each lane only after it has reaped its runners. A lane held stopped
    keeps the message from the standby for as long as it is stopped."""
    require_service("rabbitmq")
    try:
        with running(TRANSPORTS[transport][1](tmp_path, unique), tmp_path, unique) as scene:
            ledger, orphan = scene.ledger, scene.orphan
            lane = _parent_of(orphan)
            os.kill(lane, signal.SIGSTOP)
            try:
                _, gone = kill_and_time(scene.first, orphan)  # the sentinel kills it
                time.sleep(2)
                assert [pid for pid, _ in ledger.lines() if pid != orphan] == [], \
                    "redelivered while the dead worker's lane was still there"
            finally:
                os.kill(lane, signal.SIGCONT)
            again = ledger.runner(besides=orphan)
            assert gone < GONE_WITHIN and ledger.first(again) > ledger.last(orphan)
    finally:
        clean_transport(transport, unique)


def test_what_a_task_started_dies_with_its_worker_too(tmp_path: Path, unique: str) -> None:
    """A child in a session of its own is no child of the runner's for long: it is found in
    the slot's memory cgroup (the fallback without cgroups has no such list)."""
    url, queue = f"sqlite:///{tmp_path}/broker.db", f"d-{unique}"
    broker = open_broker(url)
    ledger, child_file = Ledger(tmp_path), tmp_path / "child"
    worker = start_worker(url, queue, "--concurrency=1", burst=False)
    try:
        out = consuming(worker)
        if "fall back to RLIMIT_AS" in out:
            pytest.skip("no memory cgroups here: a slot has no list of what its task started")
        enqueue(broker, task_message("t.ledger", queue, str(ledger.path), str(ledger.stop),
                                     120, str(child_file)))
        ledger.runner()
        child = int(child_file.read_text())
        _, gone = kill_and_time(worker, child)
        assert gone < GONE_WITHIN, f"the task's child {child} outlived its worker by {gone} s"
    finally:
        _stop_all(ledger, [worker], broker, queue)


def test_a_zygote_still_starting_dies_with_its_worker(tmp_path: Path, unique: str) -> None:
    """Until it serves, the zygote keeps a parent-death signal: an app whose import hangs in
    the zygote must not leave it behind a killed worker."""
    (tmp_path / f"hang_{unique}.py").write_text(
        "import sys, time\nif 'zygote' in sys.argv[0]:\n    time.sleep(600)\n")
    url = f"sqlite:///{tmp_path}/broker.db"
    env = worker_env(url, PYTHONPATH=f"{ROOT}/src:{ROOT}:{tmp_path}")
    worker = start_worker(url, f"d-{unique}", f"--app=hang_{unique}", burst=False, env=env)
    try:
        zygote = wait_for(lambda: _children(worker.pid), 30, "the zygote started")[0]
        _, gone = kill_and_time(worker, zygote)
        assert gone < GONE_WITHIN, f"the starting zygote outlived its worker by {gone} s"
    finally:
        stop(worker, signal.SIGKILL)
        finish(worker)


def test_a_worker_whose_sentinel_dies_stops_saying_so(tmp_path: Path, unique: str) -> None:
    """Without its sentinel a worker's runners would outlive it by its teardown: it stops
    (fail fast, as for a lost lane) and a restart is clean."""
    url = f"sqlite:///{tmp_path}/broker.db"
    worker = start_worker(url, f"d-{unique}", burst=False)
    try:
        consuming(worker)
        sentinel = wait_for(lambda: _sentinel_of(worker.pid), 30, "the worker's sentinel")
        os.kill(sentinel, signal.SIGKILL)
        out = finish(worker, timeout=30)
    finally:
        stop(worker, signal.SIGKILL)
    assert worker.returncode != 0 and "sentinel" in out, out


def _stop_all(ledger: Ledger, workers: list[subprocess.Popen[str]], broker: Broker,
              queue: str) -> None:
    ledger.stop.touch()
    for worker in workers:
        stop(worker, signal.SIGKILL)
        finish(worker)
    broker.purge(queue)
    broker.close()


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _sentinel_of(worker: int) -> int | None:
    from conveyor.worker import sentinel
    for pid in _children(worker):
        for child in _children(pid):
            if Path(f"/proc/{child}/comm").read_text().strip() == sentinel.NAME:
                return child
    return None


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
