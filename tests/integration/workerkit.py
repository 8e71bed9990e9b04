"""Running real `conveyor worker` processes in tests, and reading what they report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conveyor.broker import Broker, from_url
from conveyor.client import Client
from conveyor.events import Event
from conveyor.message import Codec, Message

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
