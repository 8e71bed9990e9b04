"""A broker restarted under a running `conveyor worker` and a publisher (issue 21); what the
worker promises by itself kept while its broker is away (issue 27).

Each test starts a PRIVATE server (never the shared ones other tests use): Redis with
`--appendonly yes` on a free port, a PostgreSQL cluster made with initdb in a temp dir, a
RabbitMQ node with its own name, ports and data dir. It
stops that server for longer than the worker's (shrunk) `retry_seconds`, so every pending
settle runs out of retries, then starts it again, and checks: nothing lost, every duplicate
one that was in flight at the stop, the worker's pid unchanged, consuming again within the
backoff cap, one log line per reconnect attempt at most and no traceback.

The outage lasts OUTAGE seconds (12 here, so the suite stays short); CONVEYOR_LONG_OUTAGE=1
makes it the 2 minutes the issue asks for (run by hand:
`CONVEYOR_LONG_OUTAGE=1 ./scripts/test.sh tests/integration/test_outage.py -s`), and the
test prints its figures either way.

Issue 27's tests take the broker away without a server of their own: a `Proxy`
(tests/support.py) relays to the shared server and is cut (or frozen) under the worker; for
SQLite another connection holds the file's write lock. Time limits, the drain deadline, a
cold stop and the durations logged must keep the worker's own clock throughout: 15 s
outages, 60 s with CONVEYOR_LONG_OUTAGE=1.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.broker import from_url
from conveyor.broker.reconnect import BACKOFF_CAP, JITTER
from conveyor.client import Client
from tests.conftest import SERVICES, clean_transport, require_service
from tests.contract.conftest import TRANSPORTS
from tests.integration.private_servers import PrivateServer, with_options
from tests.integration.workerkit import (
    finish,
    read_ticks,
    start_worker,
    stop,
    task_message,
    worker_env,
)
from tests.support import Proxy, wait_for

OUTAGE = 120.0 if os.environ.get("CONVEYOR_LONG_OUTAGE") == "1" else 12.0
#: The worker gives up a settle after this (the outage is longer: settles must be held).
WORKER_RETRY_SECONDS = 2
TASKS = 60
CONCURRENCY = 2
def reading(worker: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """The worker's output lines as they come, read by a thread: these tests watch the log
    while the worker runs (finish() reads it only at the end)."""
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(worker.stdout or []), daemon=True)
    reader.start()
    return output, reader


def reap(worker: subprocess.Popen[str], reader: threading.Thread) -> None:
    """Kill the worker if it still runs, and close its output once the reader has it."""
    stop(worker, signal.SIGKILL)
    worker.wait()
    reader.join(timeout=10)
    if worker.stdout is not None:
        worker.stdout.close()


class Publisher(threading.Thread):
    """Publishes TASKS record tasks, one every 0.1 s, through the outage: a publisher
    blocks while the broker is away (its retry_seconds outlasts the outage)."""

    def __init__(self, url: str, queue: str, log: Path) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.log = url, queue, log
        self.sent = 0
        self.error: BaseException | None = None
        #: Tokens whose publish spanned the outage: the broker may have stored one before its
        #: confirm was lost, and the client then publishes it again (at-least-once publish).
        self.retried: set[str] = set()

    def run(self) -> None:
        try:
            client = Client(from_url(self.url))
            for n in range(TASKS):
                began = time.monotonic()
                client.enqueue(task_message("t.record", self.queue, str(self.log), f"m{n}",
                                            0.2))
                if time.monotonic() - began > 1.0:
                    self.retried.add(f"m{n}")
                self.sent += 1
                time.sleep(0.1)
            client.broker.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def lines_of(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def done_count(log: Path) -> int:
    return sum(line.startswith("done ") for line in lines_of(log))


def ride_out(server: PrivateServer, worker_url: str, publisher_url: str, queue: str,
             tmp_path: Path) -> None:
    log = tmp_path / "record.log"
    worker = start_worker(worker_url, queue, f"--concurrency={CONCURRENCY}", burst=False,
                          env=worker_env(worker_url, CONVEYOR_LOG_LEVEL="INFO"))
    output, reader = reading(worker)
    publisher = Publisher(publisher_url, queue, log)
    try:
        publisher.start()
        wait_for(lambda: done_count(log) >= 10, 60, "10 tasks done before the outage")
        pid = worker.pid
        server.stop()
        stopped_at, lines_before = time.monotonic(), len(output)
        time.sleep(OUTAGE)
        server.start()
        back_at = time.monotonic()
        # In flight at the stop: delivered before it, so started before the broker was back
        # (a delivery a worker held but had not started yet also counts).
        in_flight = {line.split()[1] for line in lines_of(log) if line.startswith("start")}
        done_then = done_count(log)
        wait_for(lambda: done_count(log) > done_then, BACKOFF_CAP + JITTER + 15,
                 "a task done after the broker came back")
        resumed = time.monotonic() - back_at
        wait_for(lambda: publisher.sent == TASKS or publisher.error is not None, 120,
                 "the publisher")
        assert publisher.error is None, publisher.error
        tokens = {f"m{n}" for n in range(TASKS)}
        wait_for(lambda: tokens <= {line.split()[1] for line in lines_of(log)
                                    if line.startswith("done")}, 120, "every task done")
        assert worker.poll() is None and worker.pid == pid, "the worker did not survive"
        outage_lines = output[lines_before:]
    finally:
        stop(worker)
        out = finish(worker, timeout=60)
    done = [line.split()[1] for line in lines_of(log) if line.startswith("done")]
    duplicates = {token for token in done if done.count(token) > 1}
    print(f"\noutage {OUTAGE:g} s (stopped at +0, back at +{back_at - stopped_at:.1f} s): "
          f"consuming again {resumed:.1f} s after; {len(set(done))}/{TASKS} done, "
          f"{len(duplicates)} duplicate(s) {sorted(duplicates)}; worker pid {pid} kept; "
          f"{len(outage_lines)} worker log lines from the stop until every task was done")
    assert worker.returncode == 0, out
    assert "Traceback" not in out, out
    assert duplicates <= in_flight | publisher.retried, (duplicates, in_flight,
                                                          publisher.retried)
    assert len(duplicates) <= 2 * CONCURRENCY
    # One line per reconnect attempt at most: attempts come every BACKOFF_CAP s or sooner.
    assert len(outage_lines) <= 40 + 3 * OUTAGE / BACKOFF_CAP + 2 * TASKS, "".join(outage_lines)


@pytest.mark.timeout(600 if OUTAGE > 60 else 120)
def test_a_worker_and_a_publisher_ride_out_a_redis_restart(
        private_redis: PrivateServer, unique: str, tmp_path: Path) -> None:
    queue = f"q-{unique}"
    worker_url = with_options(private_redis.url, prefix=unique,
                              retry_seconds=WORKER_RETRY_SECONDS)
    publisher_url = with_options(private_redis.url, prefix=unique, retry_seconds=OUTAGE + 60)
    ride_out(private_redis, worker_url, publisher_url, queue, tmp_path)


@pytest.mark.timeout(600 if OUTAGE > 60 else 120)
def test_a_worker_and_a_publisher_ride_out_a_postgres_restart(
        private_postgres: PrivateServer, unique: str, tmp_path: Path) -> None:
    queue = f"q-{unique}"
    worker_url = with_options(private_postgres.url, schema=unique,
                              retry_seconds=WORKER_RETRY_SECONDS)
    publisher_url = with_options(private_postgres.url, schema=unique,
                                 retry_seconds=OUTAGE + 60)
    ride_out(private_postgres, worker_url, publisher_url, queue, tmp_path)


@pytest.mark.timeout(600 if OUTAGE > 60 else 120)
def test_a_worker_and_a_publisher_ride_out_a_rabbitmq_node_restart(
        private_rabbitmq: PrivateServer, unique: str, tmp_path: Path) -> None:
    queue = f"q-{unique}"
    worker_url = with_options(private_rabbitmq.url, retry_seconds=WORKER_RETRY_SECONDS)
    publisher_url = with_options(private_rabbitmq.url, retry_seconds=OUTAGE + 60)
    ride_out(private_rabbitmq, worker_url, publisher_url, queue, tmp_path)


def test_exit_after_outage_stops_the_worker_when_the_operator_asks(
        private_redis: PrivateServer, unique: str, tmp_path: Path) -> None:
    """The opt-in: with --exit-after-outage=1 a worker holding an outcome exits
    once the broker has been away that long (exit code 1, one line); the message comes back."""
    queue, log = f"q-{unique}", tmp_path / "record.log"
    url = with_options(private_redis.url, prefix=unique, retry_seconds=1)
    client = Client(from_url(url))
    client.enqueue(task_message("t.record", queue, str(log), "slow", 3.0))
    client.broker.close()
    worker = start_worker(url, queue, "--exit-after-outage=1", burst=False)
    try:
        wait_for(lambda: any(line.startswith("start") for line in lines_of(log)), 30,
                 "the task started")
        private_redis.stop()
        out = finish(worker, timeout=60)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
    assert worker.returncode == 1, out  # a runtime error (the outage): one line, exit 1
    assert "--exit-after-outage=1" in out and "Traceback" not in out, out


# -- the worker's own promises through an outage (issue 27) ---------------------------------

#: The task's limits, from its start; the broker goes away 1 s in and stays away
#: LIMITS_OUTAGE s (60 with CONVEYOR_LONG_OUTAGE=1): both limits pass while the supervisor's
#: loop is stuck in a broker call (the worker's retry_seconds is left at 60).
SOFT, HARD = 3.0, 6.0
LIMITS_OUTAGE = 60.0 if os.environ.get("CONVEYOR_LONG_OUTAGE") == "1" else 15.0
#: A limit is kept if it reaches the task this soon after it passes (generous: the machine
#: is shared, and 3 test processes beside it load it to 8-15; the precision at low load is
#: benchmarks/time_limit_precision.py's). Far below the outage's end, what a limit kept
#: only once the broker is back would show.
ON_TIME = 2.0
#: The drain timeout the worker is given (it is stopped while the broker is away).
DRAIN = 2.0
#: A task that succeeds while the broker is away: its logged duration must be this.
BRIEF = 4.0
#: A lease that outlasts these outages: the tests below check what the worker keeps by its own
#: clock while the broker is away, so the task must not be stopped by self-fencing meanwhile
#: (its own tests: tests/integration/test_partitions.py).
RIDES_OUT = f"--lease={LIMITS_OUTAGE + 30:g}"


@dataclass
class Outage:
    """A broker URL for one test, and how to take its broker away and bring it back."""

    url: str
    begin: Callable[[], None]
    end: Callable[[], None]


def relayed(transport: str, unique: str) -> Iterator[Outage]:
    """The shared server of `transport` behind a Proxy of this test's own."""
    require_service(TRANSPORTS[transport][0] or transport)
    proxy = Proxy(*SERVICES[TRANSPORTS[transport][0] or transport])
    url = {"redis": f"redis://{proxy.address}/0?prefix={unique}",
           "kombu+redis": f"kombu+redis://{proxy.address}/0?prefix={unique}:",
           "postgres": f"postgresql://postgres@{proxy.address}/postgres?schema={unique}",
           "rabbitmq": f"amqp://guest:guest@{proxy.address}/%2F"}[transport]
    try:
        yield Outage(url, proxy.cut, proxy.restore)
    finally:
        proxy.cut()
        clean_transport(transport, unique)


def locked(path: Path) -> Iterator[Outage]:
    """SQLite's outage: another process's write transaction holds the file's lock (the
    worker's calls wait on it up to their 30 s busy timeout)."""
    holder: list[sqlite3.Connection] = []

    def begin() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        holder.append(db)

    def end() -> None:
        holder.pop().rollback()

    try:
        yield Outage(f"sqlite:///{path}", begin, end)
    finally:
        for db in holder:
            db.close()


@pytest.fixture(params=["redis", "postgres", "rabbitmq", "sqlite", "kombu+redis"])
def outage(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[Outage]:
    if request.param == "sqlite":
        yield from locked(tmp_path / "broker.db")
    else:
        yield from relayed(request.param, unique)


@pytest.mark.timeout(300)
def test_time_limits_and_the_drain_deadline_are_kept_while_the_broker_is_away(
        outage: Outage, unique: str, tmp_path: Path) -> None:
    """Three tasks: one with soft and hard limits, one without any, one that succeeds in
    BRIEF s. The broker goes away 1 s into them; after the first is killed the worker is told
    to stop (SIGTERM, drain timeout DRAIN s), so the second must be killed DRAIN s later, all
    while the broker is away; the third's duration is its own, not the outage's."""
    queue, limited, unlimited = f"q-{unique}", tmp_path / "limited", tmp_path / "unlimited"
    client = Client(from_url(outage.url))
    client.enqueue(task_message("t.tick", queue, str(limited), 600, soft_time_limit=SOFT,
                                time_limit=HARD, max_retries=0))
    client.enqueue(task_message("t.tick", queue, str(unlimited), 600))
    client.enqueue(task_message("t.sleep", queue, BRIEF))
    client.broker.close()
    worker = start_worker(outage.url, queue, "--concurrency=3", f"--drain-timeout={DRAIN:g}",
                          RIDES_OUT, burst=False)
    output, reader = reading(worker)
    try:
        wait_for(lambda: read_ticks(limited) is not None and read_ticks(unlimited) is not None,
                 60, "both tasks started")
        started = read_ticks(limited).started  # type: ignore[union-attr]
        time.sleep(max(0.0, started + 1.0 - time.monotonic()))
        outage.begin()
        began = time.monotonic()
        time.sleep(max(0.0, started + HARD + 1.0 - time.monotonic()))
        stopped = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        time.sleep(max(0.0, began + LIMITS_OUTAGE - time.monotonic()))
        first, second = read_ticks(limited), read_ticks(unlimited)
        outage.end()
        worker.wait(timeout=120)  # the reader has its output: not finish()
    finally:
        reap(worker, reader)
    log = "".join(output)
    assert first is not None and first.soft is not None and second is not None, log
    logged = re.findall(r"timed_out in ([0-9.]+)s", log)
    assert logged, log
    took = float(logged[0])
    brief = re.findall(r"t.sleep .* succeeded in ([0-9.]+)s", log)
    assert brief, log
    print(f"\n{outage.url.split(':')[0]}: broker away {began - first.started:.1f} s into the "
          f"tasks for {LIMITS_OUTAGE:g} s; soft limit {SOFT:g} s reached the task at "
          f"{first.soft - first.started:.3f} s, hard {HARD:g} s killed it at "
          f"{first.lasted:.3f} s (last tick), logged timed_out in {took:.3f} s; the other "
          f"killed {second.last - stopped:.3f} s after SIGTERM (drain timeout {DRAIN:g} s); a "
          f"{BRIEF:g} s task logged succeeded in {float(brief[0]):.3f} s")
    assert SOFT - 0.1 <= first.soft - first.started < SOFT + ON_TIME, log
    assert HARD - 0.1 <= first.lasted < HARD + ON_TIME, log
    assert HARD <= took < HARD + ON_TIME, log
    assert DRAIN - 0.1 <= second.last - stopped < DRAIN + ON_TIME, log
    assert BRIEF <= float(brief[0]) < BRIEF + ON_TIME, log
    assert "killed and requeued: the drain timeout" in log, log
    assert worker.returncode == 0 and "Traceback" not in log, log


@pytest.mark.timeout(180)
def test_a_frozen_broker_never_holds_up_the_runner_watch(unique: str, tmp_path: Path) -> None:
    """Redis hangs (the relay accepts and forwards nothing) while the worker waits on it with
    a slot free. The first task's end has the broker woken, a call that now hangs for the
    client's socket timeout (15 s): the runner watch must not wait for it, or the second
    task's end (and so its duration) would wait too."""
    require_service("redis")
    proxy = Proxy(*SERVICES["redis"])
    url, queue = f"redis://{proxy.address}/0?prefix={unique}", f"q-{unique}"
    markers = [tmp_path / "first", tmp_path / "second"]
    client = Client(from_url(url))
    client.enqueue(task_message("t.sleep", queue, 2.0, str(markers[0])))
    client.enqueue(task_message("t.sleep", queue, 4.0, str(markers[1])))
    client.broker.close()
    worker = start_worker(url, queue, "--concurrency=3", RIDES_OUT, burst=False)
    output, reader = reading(worker)
    try:
        wait_for(lambda: all(m.exists() for m in markers), 60, "both tasks started")
        proxy.freeze()
        time.sleep(20)  # past both tasks' ends and the wake-up's socket timeout
        proxy.cut()
        proxy.restore()
        wait_for(lambda: "".join(output).count("succeeded in") == 2, 60,
                 "both outcomes logged once the broker answers")
    finally:
        reap(worker, reader)
        proxy.cut()
        clean_transport("redis", unique)
    log = "".join(output)
    took = sorted(float(t) for t in re.findall(r"succeeded in ([0-9.]+)s", log))
    print(f"\nredis frozen with a slot free: tasks of 2 s and 4 s logged succeeded in "
          f"{took[0]:.3f} s and {took[1]:.3f} s")
    assert 2.0 <= took[0] < 2.0 + ON_TIME and 4.0 <= took[1] < 4.0 + ON_TIME, log


@pytest.fixture(params=["redis", "postgres", "rabbitmq", "kombu+redis"])
def network_outage(request: pytest.FixtureRequest, unique: str) -> Iterator[Outage]:
    yield from relayed(request.param, unique)


@pytest.mark.timeout(120)
def test_a_cold_stop_while_the_broker_is_away_stops_at_once(network_outage: Outage,
                                                            unique: str,
                                                            tmp_path: Path) -> None:
    """A second stop signal kills the running task at once and the worker exits without
    waiting out its retry_seconds (60 s) for each call it is retrying (a heartbeat, then the
    requeue): the message comes back anyway (a lapsed lease, or RabbitMQ's own requeue)."""
    outage = network_outage
    queue, ticks = f"q-{unique}", tmp_path / "ticks"
    client = Client(from_url(outage.url))
    client.enqueue(task_message("t.tick", queue, str(ticks), 600))
    client.broker.close()
    worker = start_worker(outage.url, queue, "--concurrency=1", RIDES_OUT, burst=False)
    output, reader = reading(worker)
    try:
        wait_for(lambda: read_ticks(ticks) is not None, 60, "the task started")
        outage.begin()
        time.sleep(3)  # the loop is inside a heartbeat's retries by now
        worker.send_signal(signal.SIGINT)
        wait_for(lambda: any("draining" in line for line in output), 30, "draining")
        worker.send_signal(signal.SIGINT)
        cold = time.monotonic()
        worker.wait(timeout=60)
        exited = time.monotonic() - cold
    finally:
        reap(worker, reader)
    log = "".join(output)
    record = read_ticks(ticks)
    assert record is not None, log
    print(f"\n{outage.url.split(':')[0]}: cold stop with the broker away: task's last tick "
          f"{record.last - cold:+.3f} s from the second signal, exit {exited:.1f} s after")
    assert record.last - cold < ON_TIME, log
    assert exited < 10, log
    assert worker.returncode == 0 and "Traceback" not in log, log


@pytest.mark.timeout(180)
def test_stop_signals_act_at_once_with_the_broker_frozen(unique: str, tmp_path: Path) -> None:
    """Redis hangs (nothing answered) while the worker waits on it with a slot free. The
    first signal's wake-up of that wait hangs for the client's socket timeout (15 s): it must
    not hold up the second signal, whose kill is at once. (The exit itself then waits out a
    socket timeout per call still made: not asserted.)"""
    require_service("redis")
    proxy = Proxy(*SERVICES["redis"])
    url, queue, ticks = f"redis://{proxy.address}/0?prefix={unique}", f"q-{unique}", \
        tmp_path / "ticks"
    client = Client(from_url(url))
    client.enqueue(task_message("t.tick", queue, str(ticks), 600))
    client.broker.close()
    worker = start_worker(url, queue, "--concurrency=2", RIDES_OUT, burst=False)
    output, reader = reading(worker)
    try:
        wait_for(lambda: read_ticks(ticks) is not None, 60, "the task started")
        proxy.freeze()
        time.sleep(1)
        worker.send_signal(signal.SIGINT)
        wait_for(lambda: any("draining" in line for line in output), 30, "draining")
        worker.send_signal(signal.SIGINT)
        cold = time.monotonic()
        wait_for(lambda: any("cold shutdown" in line for line in output), 30, "cold")
        time.sleep(ON_TIME + 0.5)
        record = read_ticks(ticks)
        proxy.cut()
        proxy.restore()
        worker.wait(timeout=120)
    finally:
        reap(worker, reader)
        proxy.cut()
        clean_transport("redis", unique)
    log = "".join(output)
    assert record is not None, log
    print(f"\nredis frozen: the task's last tick {record.last - cold:+.3f} s from the second "
          f"signal")
    assert record.last - cold < ON_TIME, log
