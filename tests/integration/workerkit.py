"""Running real `conveyor worker` processes in tests, and reading what they report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from conveyor import limits
from conveyor.broker import Broker, from_url
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.events import Event
from conveyor.message import Codec, Message
from tests.conftest import clean_transport, require_service
from tests.contract.conftest import TRANSPORTS

ROOT = Path(__file__).parents[2]
APP = "tests.integration.worker_tasks"


def worker_env(broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update({"CONVEYOR_BROKER_URL": broker_url, "PYTHONPATH": f"{ROOT}/src:{ROOT}",
                "CONVEYOR_LOG_LEVEL": "INFO", **extra})
    return env


def start_worker(broker_url: str, queues: str, *flags: str, burst: bool = True,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "conveyor.cli", "worker", f"--queues={queues}",
            f"--app={APP}", "--heartbeat-interval=1", *flags]
    argv += ["--burst"] if burst else []
    return subprocess.Popen(argv, cwd=ROOT, env=env or worker_env(broker_url), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """Wait for a worker to exit; its combined output (for assertions and failures)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"worker did not exit within {timeout}s:\n{out}") from None
    return out


class Logs:
    """Reads a worker's output as it runs (so a test can wait for "consuming")."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        stream = proc.stdout
        self.thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self.thread.start()

    def consuming(self) -> bool:
        return any(" consuming " in line for line in list(self.lines))

    def text(self) -> str:
        """What it printed so far (all of it, once `close` returned)."""
        return "".join(list(self.lines))

    def close(self, proc: subprocess.Popen[str]) -> None:
        """Wait for the stopped worker (killed if it has not ended in 30 s) and close its
        output."""
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        self.thread.join(10)
        assert proc.stdout is not None
        proc.stdout.close()


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def stop_cold(proc: subprocess.Popen[str], first: int = signal.SIGINT,
              second: int = signal.SIGINT) -> str:
    """A cold stop: the first signal, then, once the worker says it is draining, the second.
    Two signals sent back to back are one: the kernel (or CPython, before its handler ran)
    merges a signal that is still pending. Returns the output read meanwhile."""
    stop(proc, first)
    assert proc.stdout is not None
    before = []
    for line in proc.stdout:   # pytest's timeout ends this if it never says so
        before.append(line)
        if "draining" in line:
            break
    stop(proc, second)
    return "".join(before)


def enqueue(broker: Broker, message: Message, delay: float = 0.0,
            codec: Codec | None = None) -> Message:
    return Client(broker, codec).enqueue(message, delay).message


def task_message(task: str, queue: str, *args: Any, reply_to: str = "", **fields: Any
                 ) -> Message:
    return Message(queue=queue, task=task, args=args, reply_to=reply_to, **fields)


def events(broker: Broker, queue: str, timeout: float = 0.5) -> Iterator[Event]:
    """Every event waiting on `queue`, acked as read."""
    for delivery in broker.consume([queue], prefetch=64, timeout=timeout):
        if delivery is None:
            return
        broker.ack(delivery)
        yield Event.decode(delivery.body)


def wait_event(broker: Broker, queue: str, kind: str, timeout: float = 30) -> Event:
    deadline = time.monotonic() + timeout
    for delivery in broker.consume([queue], prefetch=64, timeout=0.2):
        if delivery is not None:
            broker.ack(delivery)
            event = Event.decode(delivery.body)
            if event.kind == kind:
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no {kind!r} event on {queue} within {timeout}s")
    raise AssertionError("unreachable")


def open_broker(url: str) -> Broker:
    return from_url(url)


@dataclass(frozen=True)
class Ticks:
    """What a `t.tick` task wrote (worker_tasks.py), on CLOCK_MONOTONIC: when its first run
    started, when that run's soft time limit reached it (None: never), its last tick; and
    how many runs started (a redelivery starts another)."""

    started: float
    soft: float | None
    last: float
    runs: int

    @property
    def lasted(self) -> float:
        """Seconds from the first run's start to its last tick: when it was killed, to
        within a tick (20 ms)."""
        return self.last - self.started


def read_ticks(path: Path) -> Ticks | None:
    """The `t.tick` record at `path`, or None before its first run started."""
    lines = path.read_text().splitlines() if path.exists() else []
    starts = [n for n, line in enumerate(lines) if line.startswith("start ")]
    if not starts:
        return None
    first = lines[starts[0]:starts[1] if len(starts) > 1 else None]
    started = float(first[0].split()[2])
    stamps = []
    for line in first[1:]:
        kind, _, at = line.partition(" ")
        try:
            stamps.append((kind, float(at)))
        except ValueError:
            continue  # its last line, cut short by the kill
    soft = next((at for kind, at in stamps if kind == "soft"), None)
    last = max((at for kind, at in stamps if kind == "tick"), default=started)
    return Ticks(started, soft, last, len(starts))


@dataclass
class Setup:
    """A test's broker on one transport, a client on it, its queue, and the environment
    its workers get."""

    url: str
    queue: str
    broker: Broker
    client: Client
    env: dict[str, str]

    def worker(self, *flags: str, burst: bool = True) -> subprocess.Popen[str]:
        return start_worker(self.url, self.queue, *flags, burst=burst, env=self.env)


SetupT = TypeVar("SetupT", bound=Setup)


@contextmanager
def transport_url(transport: str, tmp_path: Path, unique: str) -> Iterator[str]:
    """A broker URL on `transport` (a name from tests/contract/conftest.py) holding the test's
    unique name; what the test left on the server is removed after it."""
    service, make_url = TRANSPORTS[transport]
    if service:
        require_service(service)
    try:
        yield make_url(tmp_path, unique)
    finally:
        clean_transport(transport, unique)


@contextmanager
def transport_setup(kind: type[SetupT], transport: str, tmp_path: Path, unique: str,
                    queue: str, **env: str) -> Iterator[SetupT]:
    """A `kind` of Setup on `transport` (see `transport_url`), with the state store a SQLite
    file both sides are told of (where RabbitMQ and kombu keep unique keys and cancels)."""
    with transport_url(transport, tmp_path, unique) as url:
        worker = worker_env(url, CONVEYOR_STATE_URL=f"sqlite:///{tmp_path}/state.db", **env)
        settings = Settings.from_env(worker)
        broker = open_broker(url)
        client = Client(broker, settings=settings,
                        limiter=limits.from_url(settings.stores().limits))
        try:
            yield kind(url, queue, broker, client, worker)
        finally:
            client.close()
