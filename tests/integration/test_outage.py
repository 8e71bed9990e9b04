"""A broker restarted under a running `conveyor worker` and a publisher (issue 21).

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
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.broker import from_url
from conveyor.broker.reconnect import BACKOFF_CAP, JITTER
from conveyor.client import Client
from tests.integration.workerkit import finish, start_worker, stop, task_message, worker_env

OUTAGE = 120.0 if os.environ.get("CONVEYOR_LONG_OUTAGE") == "1" else 12.0
#: The worker gives up a settle after this (the outage is longer: settles must be held).
WORKER_RETRY_SECONDS = 2
TASKS = 60
CONCURRENCY = 2
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None) \
    if Path("/usr/lib/postgresql").exists() else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@dataclass
class PrivateServer:
    """A broker server of this test's own: `stop()` and `start()` it at will."""

    url: str
    port: int
    start: Callable[[], None]
    stop: Callable[[], None]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here")
    port, procs = free_port(), []
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        wait_for(lambda: accepts(port), 20, "the private Redis")

    def stop_it() -> None:
        proc = procs.pop()
        proc.terminate()  # SIGTERM: Redis flushes its AOF and exits
        proc.wait(timeout=30)

    start()
    yield PrivateServer(f"redis://127.0.0.1:{port}/0", port, start, stop_it)
    while procs:
        stop_it()


@pytest.fixture
def private_postgres() -> Iterator[PrivateServer]:
    if PG_BIN is None:
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) here")
    # Its own directory under /tmp: pytest's tmp_path is not reachable by the postgres user.
    home = Path(tempfile.mkdtemp(prefix="conveyor-pg-"))
    port, data = free_port(), home / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(home, "postgres")
    ctl = [*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(home / "log")]
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"

    def start() -> None:
        subprocess.run([*ctl, "-o", options, "-w", "start"], check=True, capture_output=True,
                       timeout=60)

    def stop_it() -> None:
        subprocess.run([*ctl, "-m", "fast", "-w", "stop"], check=True, capture_output=True,
                       timeout=60)

    try:
        subprocess.run([*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-U",
                        "postgres", "--auth=trust", "-N"], check=True, capture_output=True,
                       timeout=120)
        start()
        yield PrivateServer(f"postgresql://postgres@127.0.0.1:{port}/postgres", port, start,
                            stop_it)
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


@pytest.fixture
def private_rabbitmq(unique: str) -> Iterator[PrivateServer]:
    """A RabbitMQ node of this test's own: its own node name, ports, data and logs in a temp
    dir, no plugins (the shared node holds the management port); stopped and started with
    `rabbitmqctl -n <node>`, which never touches the shared node."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        pytest.skip("RabbitMQ server scripts (/usr/lib/rabbitmq/bin) are not installed here")
    home = Path(tempfile.mkdtemp(prefix="conveyor-rabbit-"))
    (home / "plugins").write_text("[].\n")
    port, node, procs = free_port(), f"conveyor-{unique}@localhost", []
    env = {**os.environ, "HOME": str(home), "RABBITMQ_NODENAME": node,
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(free_port()),
           "RABBITMQ_MNESIA_BASE": str(home / "mnesia"), "RABBITMQ_LOG_BASE": str(home / "log"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "plugins"),
           "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"), "RABBITMQ_PID_FILE": str(home / "pid")}

    def start() -> None:
        with open(home / "server.out", "a") as out:
            procs.append(subprocess.Popen([str(RABBITMQ_BIN / "rabbitmq-server")], env=env,
                                          stdout=out, stderr=subprocess.STDOUT))
        wait_for(lambda: accepts(port), 60, "the private RabbitMQ node")

    def stop_it() -> None:
        subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node, "stop"], env=env,
                       capture_output=True, timeout=60)
        procs.pop().wait(timeout=60)

    try:
        start()
        yield PrivateServer(f"amqp://guest:guest@127.0.0.1:{port}/%2F", port, start, stop_it)
    finally:
        while procs:
            stop_it()
        shutil.rmtree(home, ignore_errors=True)


def with_options(url: str, **options: object) -> str:
    return url + "?" + "&".join(f"{k}={v}" for k, v in options.items())


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
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(worker.stdout or []), daemon=True)
    reader.start()
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
