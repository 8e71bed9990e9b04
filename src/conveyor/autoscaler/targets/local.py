"""`conveyor worker` processes on this machine: the embedded default autoscales too.

Each replica is one worker process with `--concurrency` = slots per replica, serving its
/metrics on a free loopback port so the autoscaler can see whether it is busy. Scaling
down sends SIGTERM to the idlest workers: they stop fetching, finish what they hold
within `--drain-timeout`, and exit; they are reaped on later polls (and stop counting at
once, as terminating pods do). Closing the target drains every worker and waits for it.

Workers run in their own session, so a Ctrl-C at the autoscaler's terminal does not reach
them (a second signal would be a cold stop), and they get SIGTERM should the autoscaler
die: none outlives its manager unseen.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from conveyor.autoscaler.probes import deletion_cost, worker_in_flight

log = logging.getLogger("conveyor.autoscaler")

#: Grace beyond --drain-timeout before a stopping worker is killed: it should have
#: interrupted and requeued its tasks and exited by then.
KILL_AFTER = 30.0
#: Runs before the worker's exec: SIGTERM (PR_SET_PDEATHSIG) when the autoscaler dies;
#: exits if it already has.
_SHIM = ("import ctypes, os, signal, sys\n"
         "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
         "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
         "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n")


@dataclass(eq=False)
class Worker:
    proc: subprocess.Popen[bytes]
    metrics_port: int
    started: float
    stopping_since: float | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


class LocalWorkers:
    """Replicas as child processes of the autoscaler."""

    def __init__(self, name: str, queues: Sequence[str], slots: int, drain_timeout: float,
                 broker_url: str = "", worker_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.queues, self.slots = name, tuple(queues), slots
        self.drain_timeout = drain_timeout
        self.worker_args = tuple(worker_args)
        self._env = dict(os.environ if env is None else env)
        if broker_url:
            self._env["CONVEYOR_BROKER_URL"] = broker_url
        self._clock = clock
        self._live: list[Worker] = []
        self._stopping: list[Worker] = []
        self._started = 0

    def replicas(self) -> int:
        self._reap()
        return len(self._live)

    def scale(self, replicas: int, current: int) -> None:
        self._reap()
        while len(self._live) < replicas:
            self._start()
        surplus = len(self._live) - replicas
        if surplus > 0:
            for worker in self._idlest(surplus):
                self._stop(worker)

    def replace_args(self, worker_args: Sequence[str]) -> None:
        """Workers started from now on get `worker_args`; the running ones drain and exit
        (their queues' depth starts new ones at the next evaluation)."""
        self.worker_args = tuple(worker_args)
        for worker in list(self._live):
            self._stop(worker)

    def pids(self) -> list[int]:
        """Every worker process still running, stopping ones included."""
        return [w.proc.pid for w in (*self._live, *self._stopping) if w.proc.poll() is None]

    # -- starting and stopping ------------------------------------------------------------

    def _argv(self, port: int) -> list[str]:
        self._started += 1
        return [sys.executable, "-m", "conveyor.cli", "worker",
                f"--queues={','.join(self.queues)}", f"--concurrency={self.slots}",
                f"--drain-timeout={self.drain_timeout:g}", f"--metrics-port={port}",
                f"--hostname={self.name}-{self._started}", *self.worker_args]

    def _start(self) -> None:
        port = _free_port()
        argv = [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *self._argv(port)[1:]]
        proc = subprocess.Popen(argv, env=self._env, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self._live.append(Worker(proc, port, self._clock()))
        log.info("target %s: started worker pid %d (queues %s, %d slots, /metrics on "
                 "port %d)", self.name, proc.pid, ",".join(self.queues), self.slots, port)

    def _idlest(self, n: int) -> list[Worker]:
        """The `n` workers cheapest to stop: idle first, then unknown, busy last; newest
        first among equals."""
        costs = {w: deletion_cost(worker_in_flight(w.metrics_url, timeout=0.5))
                 for w in self._live}
        return sorted(self._live, key=lambda w: (costs[w], -w.started))[:n]

    def _stop(self, worker: Worker) -> None:
        worker.proc.send_signal(signal.SIGTERM)
        worker.stopping_since = self._clock()
        self._live.remove(worker)
        self._stopping.append(worker)
        log.info("target %s: stopping worker pid %d: it drains (up to %gs) and exits",
                 self.name, worker.proc.pid, self.drain_timeout)

    def _reap(self) -> None:
        for worker in list(self._live):
            code = worker.proc.poll()
            if code is not None:
                self._live.remove(worker)
                log.error("target %s: worker pid %d exited on its own (code %d); another "
                          "starts at the next poll if still needed", self.name,
                          worker.proc.pid, code)
        for worker in list(self._stopping):
            code = worker.proc.poll()
            if code is not None:
                self._stopping.remove(worker)
                log.info("target %s: worker pid %d drained and exited (code %d)", self.name,
                         worker.proc.pid, code)
            elif self._overdue(worker):
                log.error("target %s: worker pid %d still running %gs after SIGTERM; "
                          "killing it (its deliveries come back when their leases expire)",
                          self.name, worker.proc.pid, self.drain_timeout + KILL_AFTER)
                worker.proc.kill()

    def _overdue(self, worker: Worker) -> bool:
        since = worker.stopping_since
        return since is not None and self._clock() - since > self.drain_timeout + KILL_AFTER

    def close(self) -> None:
        """Drain every worker and wait for all of them to exit."""
        for worker in list(self._live):
            self._stop(worker)
        while self._stopping:
            self._reap()
            if self._stopping:
                time.sleep(0.05)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
