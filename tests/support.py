"""Helpers the tests (and the benchmarks) share: waiting for a condition, the first delivery,
the real command line, and an executor that only records.

* `wait_for` checks a condition until it holds (never sleep and hope); `first` takes the
  first delivery a broker gives within a timeout.
* `conveyor`, `spawn` and `stop` run the real command line, and never leave a process behind.
* `Proxy` relays TCP to a service and can cut it: an outage of that service for one test.
* `free_port` gives a port for a server a test starts, that nothing else will take meanwhile.
* `RecordingExecutor` stands in for a real executor when a test drives the scheduler's engine
  with a fake clock: it keeps each workload it is given, and `event(...)` builds the events a
  worker would send back for one of them.

Fixtures and the services' URLs live in `tests/conftest.py`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from conveyor.broker import Broker, Delivery
from conveyor.events import Event
from conveyor.scheduler.daemon import Daemon
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Workload, event_for
from conveyor.state.records import TaskInstance


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
            if _sent_as(work) == task_id:
                return self.sent.pop(i)
        raise AssertionError(f"{task_id} was not dispatched; sent: {self.task_ids()}")

    def task_ids(self) -> list[str]:
        return [_sent_as(w) for w in self.sent]


def _sent_as(work: Workload) -> str:
    """A workload's task id, or `callback:KIND` for a callback's (scheduler/callbacks.py)."""
    headers = work.message.headers
    return headers.get("task_id") or f"callback:{headers.get('callback_kind', '?')}"


def task_instance(**given: Any) -> TaskInstance:
    """A task instance for a test of a pure function: `given` fields over plain defaults
    (`spec` as data)."""
    fields: dict[str, Any] = {
        "ti_id": "ti1", "run_id": "r1", "task_id": "t", "position": 0, "state": "queued",
        "attempt": 1, "max_attempts": 1, "executor": "queue", "queue": "default",
        "priority": 0, "spec": {}, "queued_timeout": 600.0, "heartbeat_timeout": 300.0,
        "is_branch": 0}
    fields |= dict.fromkeys(("queued_at", "published_at", "started_at", "heartbeat_at",
                             "ended_at", "next_retry_at", "deadline", "error", "hostname",
                             "pid", "result", "tries", "claimed_by", "map_index", "map_task",
                             "map_count", "waiting_for", "trigger_event"))
    return TaskInstance(**{**fields, **given})


def event(work: Workload, kind: str, at: float, **fields: Any) -> Event:
    """The event a worker would send about `work` at time `at`."""
    return event_for(work.message, kind, at=at, **fields)


#: One file per port handed out by `free_port`, on this machine, for every test run on it.
PORTS_TAKEN = Path(tempfile.gettempdir()) / f"conveyor-test-ports-{os.getuid()}"
#: How long a port handed out stays out of `free_port`'s hands: longer than any test.
PORT_HOLD = 3600.0


def free_port(*hosts: str) -> int:
    """A TCP port nothing listens on at `hosts` (127.0.0.1 by default), for a server a test
    starts (a Redis, a RabbitMQ node, a metrics endpoint) and binds a moment later.

    A port from bind(0), given up again, was the kernel's to hand to the next connection
    anyone on the machine opens or to the next bind(0) of another test (3 xdist workers,
    other runs beside): then the server did not start, rarely, under load. So the port comes
    from below the kernel's ephemeral range (net.ipv4.ip_local_port_range), which neither
    takes from, and is claimed by creating a file of its name in PORTS_TAKEN exclusively, so
    no other caller on the machine is handed it for PORT_HOLD seconds."""
    hosts = hosts or ("127.0.0.1",)
    low = _ephemeral_low()
    PORTS_TAKEN.mkdir(exist_ok=True)
    for _ in range(500):
        port = random.randrange(max(1024, low - 12000), low)
        if _claim(port) and all(_bindable(host, port) for host in hosts):
            return port
    raise AssertionError(f"no free port below {low} after 500 tries: is {PORTS_TAKEN} full "
                         f"of claims younger than {PORT_HOLD:g} s? (remove them if so)")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _claim(port: int) -> bool:
    """Claim `port` for this caller; False if another holds it (a stale claim is taken over)."""
    path = PORTS_TAKEN / str(port)
    try:
        if time.time() - path.stat().st_mtime > PORT_HOLD:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        return False
    return True


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class Proxy:
    """A TCP relay to `host:port` that a test can cut (every connection dropped, new ones
    refused) and restore on the same port: an outage of a shared service (Redis, Postgres,
    RabbitMQ) for the clients of this test alone, without touching the service. `freeze()`
    is the other kind of outage: connections stay open and new ones are accepted, but nothing
    comes back (a hung server, a network dropping packets); `cut()` and `restore()` end it."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = free_port()  # restored on the same port: none a connection could take
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._frozen = False
        self.restore()

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT`, for a URL's host and port."""
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        self._frozen = True

    def restore(self) -> None:
        self._frozen = False
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, listener)

    def cut(self) -> None:
        with self._lock:
            doomed = [s for s in [self._listener, *self._sockets] if s is not None]
            self._listener, self._sockets = None, []
        for sock in doomed:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self._frozen:
                    sink.sendall(data)
        except OSError:
            return
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def conveyor(*args: str, env: Mapping[str, str] | None = None, check: bool = True,
             timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `conveyor ARGS…` as a user would, and return what it printed.

    A command given its own `--timeout N` gets N + 30 s: killing it at the moment it would
    have said what it waited for loses the one message that explains a slow run.
    """
    if "--timeout" in args:
        timeout = max(timeout, float(args[args.index("--timeout") + 1]) + 30.0)
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


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """`asyncio.run(coro)` on a thread of its own: a test process that drove a browser
    through Playwright's sync API keeps an event loop marked running on its main thread, and
    asyncio.run() refuses to start there (a CI run failed so)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
