"""The local executor: run attempts on the scheduler's own host, in the worker's runner.

Tiny, latency-sensitive tasks should not wait for a broker round trip to another machine.
The scheduler starts a private `conveyor worker` child (the very same supervisor, non-dumpable
prewarmed runners, per-task memory cgroups, time limits and outcome classification) and feeds
it through a private embedded SQLite queue in a temporary directory that no other process
knows: a publish reaches the child through a Unix-socket wake-up in well under a millisecond.
The child's events come back on the same private file and are handed to the daemon.

The child dies with the scheduler (PR_SET_PDEATHSIG), so a killed scheduler leaks no worker;
attempts it was running are retried by the heartbeat timeout. The child imports the modules
of the registered tasks that the loaded DAGs run on this executor (`apps`). When a reloaded
DAG file changes that set, a new child starts with the new set and the old one drains
(SIGTERM: it stops fetching and finishes what it holds), before anything new is submitted.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from conveyor import broker as brokers
from conveyor.client import Client
from conveyor.errors import ConveyorError
from conveyor.events import Event
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Report, Workload

log = logging.getLogger("conveyor.scheduler")

WORK_QUEUE = "local"
EVENTS_QUEUE = "events"
PR_SET_PDEATHSIG = 1


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, slots: int = 4, apps: Sequence[str] = (),
                 drain_timeout: float = 10.0, dags_folder: str = "") -> None:
        """`dags_folder`: the scheduler's, whose files the worker imports too (the tasks a
        DAG file defines itself are registered nowhere else)."""
        self.slots = slots
        self.apps = list(apps)
        self.dags_folder = dags_folder
        self.drain_timeout = drain_timeout
        self._dir = ""
        self._client: Client | None = None
        self._events: brokers.Consumer | None = None
        self._worker: subprocess.Popen[bytes] | None = None
        self._url = ""
        #: children draining after an app change: reaped by `check`, waited for by `close`
        self._retired: list[subprocess.Popen[bytes]] = []
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._failure: BaseException | None = None

    def start(self, report: Report) -> None:
        super().start(report)
        self._dir = tempfile.mkdtemp(prefix="conveyor-local-")
        url = self._url = f"sqlite:///{self._dir}/queue.db"
        self._client = Client(brokers.from_url(url))
        self._events = brokers.from_url(url)
        self._worker = self._spawn(url)
        self._thread = threading.Thread(target=self._relay, name="conveyor-local-events",
                                        daemon=True)
        self._thread.start()

    def _spawn(self, url: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "conveyor.cli", "worker", "--queues", WORK_QUEUE,
                   "--concurrency", str(self.slots), "--broker", url, "--log-level", "WARNING",
                   "--hostname", f"{socket.gethostname()}-local"]
        if self.apps:
            command += ["--app", ",".join(self.apps)]
        command += [f"--dags-folder={self.dags_folder}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent())

    def use_apps(self, apps: Sequence[str]) -> None:
        """A new child for a new set of task modules; the old one drains and exits."""
        if sorted(apps) == sorted(self.apps):
            return
        self.apps = list(apps)
        if self._worker is None:
            return
        old = self._worker
        old.send_signal(signal.SIGTERM)
        self._retired.append(old)
        self._worker = self._spawn(self._url)
        log.info("local executor: task modules now %s: worker pid %d drains, pid %d serves",
                 ",".join(self.apps) or "none", old.pid, self._worker.pid)

    def submit(self, workload: Workload) -> None:
        if self._client is None:
            raise ExecutorError("the local executor was not started")
        self._client.enqueue(replace(workload.message, queue=WORK_QUEUE,
                                     reply_to=EVENTS_QUEUE))

    def _relay(self) -> None:
        """Hand the child's events to the daemon (this thread's only job)."""
        assert self._events is not None
        try:
            for delivery in self._events.consume([EVENTS_QUEUE], prefetch=64, timeout=5.0):
                if self._closing.is_set():
                    return
                if delivery is not None:
                    self._report(Event.decode(delivery.body))
                    self._events.ack(delivery)
        except BaseException as exc:   # the daemon sees it through check() and stops
            self._failure = exc

    def check(self) -> None:
        if self._failure is not None:
            raise ConveyorError(f"the local executor stopped relaying events: {self._failure!r}")
        self._retired = [w for w in self._retired if w.poll() is None]
        if self._worker is not None and self._worker.poll() is not None:
            raise ConveyorError(f"the local executor's worker (pid {self._worker.pid}) exited "
                                f"with code {self._worker.returncode}: see its log above")

    def close(self) -> None:
        self._closing.set()
        if self._worker is not None and self._worker.poll() is None:
            self._worker.send_signal(signal.SIGTERM)   # retired ones drain already
        for child in [w for w in (self._worker, *self._retired) if w is not None]:
            try:
                child.wait(self.drain_timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self._events is not None:
            self._events.wakeup()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for broker in (self._client, self._events):
            if broker is not None:
                broker.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def _die_with_parent() -> Callable[[], object]:
    """A pre-exec hook asking the kernel to SIGKILL the child when we die.

    `prctl` is looked up here, in the parent, so the child only makes one plain call
    between fork and exec (no dlopen, no allocation that another thread could hold a lock of).
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
