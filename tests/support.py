"""Helpers the tests (and the benchmarks) share: waiting for a condition, the first delivery,
the real command line, and an executor that only records.

* `wait_for` checks a condition until it holds (never sleep and hope); `first` takes the
  first delivery a broker gives within a timeout.
* `conveyor`, `spawn` and `stop` run the real command line, and never leave a process behind.
* `RecordingExecutor` stands in for a real executor when a test drives the scheduler's engine
  with a fake clock: it keeps each workload it is given, and `event(...)` builds the events a
  worker would send back for one of them.

Fixtures and the services' URLs live in `tests/conftest.py`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from conveyor.broker import Broker, Delivery
from conveyor.events import Event
from conveyor.scheduler.daemon import Daemon
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Workload, event_for


class RecordingExecutor(Executor):
    """Records workloads; refuses those whose task is listed in `refuse`."""

    def __init__(self, name: str = "queue", refuse: tuple[str, ...] = ()) -> None:
        self.name = name
        self.refuse = refuse
        self.sent: list[Workload] = []

    def submit(self, workload: Workload) -> None:
        if workload.message.headers.get("task_id") in self.refuse:
            raise ExecutorError(f"refused {workload.message.headers['task_id']}")
        self.sent.append(workload)

    def pop(self, task_id: str) -> Workload:
        """The oldest recorded workload of `task_id`, removed."""
        for i, work in enumerate(self.sent):
            if work.message.headers["task_id"] == task_id:
                return self.sent.pop(i)
        raise AssertionError(f"{task_id} was not dispatched; sent: {self.task_ids()}")

    def task_ids(self) -> list[str]:
        return [w.message.headers["task_id"] for w in self.sent]


def event(work: Workload, kind: str, at: float, **fields: Any) -> Event:
    """The event a worker would send about `work` at time `at`."""
    return event_for(work.message, kind, at=at, **fields)


def conveyor(*args: str, env: Mapping[str, str] | None = None, check: bool = True,
             timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `conveyor ARGS…` as a user would, and return what it printed."""
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"conveyor {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def spawn(*args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `conveyor ARGS…` in the background (stop it with `stop`)."""
    return subprocess.Popen([sys.executable, "-m", "conveyor.cli", *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> int:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL: never leave it running."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()
    return proc.returncode


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "", *,
             detail: Callable[[], str] | None = None,
             ignore: tuple[type[Exception], ...] = ()) -> Any:
    """Check `predicate` every 20 ms until it is truthy and return its value; fail after
    `timeout` seconds, saying `what` was awaited and `detail()` (a log tail, say). Exceptions
    in `ignore` count as not yet (a file not written yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}"
                         + (f"\n{detail()}" if detail else ""))


def first(broker: Broker, queues: list[str], timeout: float = 5.0,
          prefetch: int = 1) -> Delivery | None:
    """The first delivery within `timeout` seconds, or None."""
    deadline = time.monotonic() + timeout
    for delivery in broker.consume(queues, prefetch=prefetch, timeout=0.2):
        if delivery is not None or time.monotonic() > deadline:
            return delivery
    return None


def run_to_end(daemon: Daemon, timeout: float = 60.0) -> None:
    """Run the daemon until no run is queued or running (`burst`); stop it after `timeout`
    seconds whatever happens, so a stuck worker fails the test instead of hanging it."""
    watchdog = threading.Timer(timeout, daemon.stop)
    watchdog.start()
    try:
        daemon.run(burst=True)
    finally:
        watchdog.cancel()
