"""The runner pool: the zygote process, runners forked ahead of need, and their watcher.

The supervisor's main thread asks the pool for an idle runner, hands it a task and later
collects it from `finished`. A watcher thread reads everything runners and the zygote send
(reports, exit statuses, stdout/stderr lines) and calls `on_change` (the broker's wakeup) so
the main thread, blocked on the broker, reacts at once instead of polling.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.errors import ConfigError
from conveyor.worker import protocol

log = logging.getLogger("conveyor.worker")
task_log = logging.getLogger("conveyor.task")


@dataclass(eq=False)
class Runner:
    """One forked runner and whatever task it is running."""

    pid: int
    pidfd: int
    channel: socket.socket
    output: int
    slot: Any = None  # its memory cgroup (conveyor.worker.cgroups.Slot), entered at fork
    task: Any = None  # the supervisor's record of the task running here
    started: float = 0.0
    report: dict[str, Any] | None = None
    exec_mode: bool = False
    status: int | None = None  # raw waitpid status once it has exited
    tasks_done: int = 0
    handed_over: bool = False  # its current run was already given to `finished`
    closed: bool = False
    _partial: bytes = field(default=b"", repr=False)

    def signal(self, signum: int) -> None:
        """Signal through the pidfd: never hits a recycled pid."""
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except ProcessLookupError:
            return

    @property
    def exited(self) -> bool:
        return self.status is not None


class Pool:
    """Keeps `warm` runners forked ahead and tells the supervisor when runs finish."""

    def __init__(self, apps: list[str], env: Mapping[str, str], on_change: Callable[[], None],
                 limiter: Any, max_tasks_per_child: int = 1, uid: int | None = None,
                 gid: int | None = None, warm: int = 1) -> None:
        self.on_change = on_change
        self.limiter = limiter
        self._spawned = 0
        self.max_tasks = max_tasks_per_child
        self.warm = warm
        self._idle: collections.deque[Runner] = collections.deque()
        self._requested: collections.deque[tuple[socket.socket, int, Any]] = collections.deque()
        self._lock = threading.Lock()
        self.finished: queue.SimpleQueue[Runner] = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._stopping = False
        self.failure: str | None = None
        self._by_pid: dict[int, Runner] = {}
        self._zygote, self._control = self._start_zygote(apps, env, uid, gid)
        self._watcher = threading.Thread(target=self._watch, name="runner-watcher", daemon=True)
        self._watcher.start()
        self.fill()

    # -- the zygote -------------------------------------------------------------------------

    def _start_zygote(self, apps: list[str], env: Mapping[str, str], uid: int | None,
                      gid: int | None) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = protocol.pair()
        argv = [sys.executable, "-m", "conveyor.worker.zygote",
                "--control-fd", str(theirs.fileno()), "--max-tasks", str(self.max_tasks)]
        argv += [f"--app={app}" for app in apps]
        argv += [f"--uid={uid}"] if uid is not None else []
        argv += [f"--gid={gid}"] if gid is not None else []
        proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=dict(env),
                                stderr=subprocess.PIPE)
        theirs.close()
        ours.settimeout(60)
        ready = protocol.recv(ours)
        ours.settimeout(None)
        if ready is None or ready.get("op") != "ready":
            proc.wait(10)
            detail = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise ConfigError(f"the runner zygote failed to start (exit {proc.returncode}): "
                              f"{detail.splitlines()[-1] if detail else 'no output'}")
        assert proc.stderr is not None
        proc.stderr.close()
        return proc, ours

    def fill(self) -> None:
        """Ask the zygote for runners until `warm` are idle or on their way.

        Called on the watcher thread whenever a runner exits (and once at start), so
        forking replacements never sits on the supervisor's path from claim to start.
        """
        with self._lock:
            missing = self.warm - len(self._idle) - len(self._requested)
        for _ in range(max(0, missing)):
            self._request_runner()

    def _request_runner(self) -> None:
        """Fork a runner into a fresh memory cgroup of its own, ahead of any task.

        The runner joins its cgroup itself, right after the fork: moving a process between
        cgroups waits for a kernel RCU grace period (milliseconds), which must not sit on a
        task's path. When the task arrives only its cap is written (`slot.set_limit`).
        """
        self._spawned += 1
        slot = self.limiter.prepare(f"{os.getpid()}-{self._spawned}", 0)
        ours, theirs = protocol.pair()
        out_r, out_w = os.pipe()
        with self._lock:
            self._requested.append((ours, out_r, slot))
        procs = str(slot.path / "cgroup.procs") if slot.path is not None else ""
        try:
            protocol.send(self._control, {"op": "spawn", "cgroup_procs": procs},
                          [theirs.fileno(), out_w])
        finally:
            theirs.close()
            os.close(out_w)

    # -- the supervisor's side ----------------------------------------------------------------

    def take(self) -> Runner | None:
        """An idle, warm runner, or None if none is ready yet (one is then on its way)."""
        with self._lock:
            return self._idle.popleft() if self._idle else None

    def start(self, runner: Runner, task: Any, frame: dict[str, Any]) -> None:
        runner.task, runner.started, runner.report = task, time.monotonic(), None
        runner.exec_mode = runner.handed_over = False
        protocol.send(runner.channel, frame)

    def release(self, runner: Runner) -> None:
        """After a finished run: a reusable runner goes back to idle, a spent one is closed.

        Descriptors of exited runners were unregistered by the watcher; closing them here
        is safe. A reusable runner that has run its last task exits by itself.
        """
        runner.task = None
        if runner.exited:
            _close(runner)
        elif runner.tasks_done < self.max_tasks:
            with self._lock:
                self._idle.append(runner)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        """Stop the zygote; it SIGKILLs every runner it forked, busy or idle."""
        self._stopping = True
        self._control.close()
        try:
            self._zygote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._zygote.kill()
            self._zygote.wait()
        self._watcher.join(timeout=5)

    # -- the watcher thread -------------------------------------------------------------------

    def _watch(self) -> None:
        self._selector.register(self._control, selectors.EVENT_READ, ("control", None))
        try:
            while not self._stopping:
                for key, _ in self._selector.select(timeout=1.0):
                    if self._selector.get_map().get(key.fd) is not key:
                        continue  # unregistered earlier in this same batch
                    kind, runner = key.data
                    self._dispatch(kind, runner)
        except Exception as exc:  # noqa: BLE001 - any watcher death must stop the worker
            if not self._stopping:
                log.exception("the runner watcher stopped unexpectedly")
                self._fail(f"the runner watcher stopped: {type(exc).__name__}: {exc}")

    def _fail(self, reason: str) -> None:
        """Fail fast: the supervisor sees `failure` and exits; a restart is clean."""
        self.failure = reason
        self._stopping = True
        self.on_change()

    def _dispatch(self, kind: str, runner: Runner | None) -> None:
        if kind == "control":
            self._on_control()
        elif kind == "channel" and runner is not None:
            self._on_channel(runner)
        elif runner is not None:
            self._on_output(runner)

    def _on_control(self) -> None:
        frame, fds = protocol.recv_with_fds(self._control, max_fds=1)
        if frame is None:
            if not self._stopping:
                log.error("the runner zygote exited unexpectedly; stopping the worker")
                self._fail("the runner zygote exited unexpectedly")
            return
        if frame["op"] == "spawned":
            self._on_spawned(frame["pid"], fds[0])
        elif frame["op"] == "exited":
            self._on_exited(frame["pid"], frame["status"])

    def _on_spawned(self, pid: int, pidfd: int) -> None:
        with self._lock:
            channel, output, slot = self._requested.popleft()
        runner = Runner(pid=pid, pidfd=pidfd, channel=channel, output=output, slot=slot)
        if slot.path is None:
            slot.admit(pid)  # the rlimit fallback: prlimit from here is cheap
        self._by_pid[pid] = runner
        self._selector.register(channel, selectors.EVENT_READ, ("channel", runner))
        self._selector.register(output, selectors.EVENT_READ, ("output", runner))
        with self._lock:
            self._idle.append(runner)
        self.on_change()

    def _on_exited(self, pid: int, status: int) -> None:
        runner = self._by_pid.pop(pid, None)
        if runner is None:
            return
        self._drain_channel(runner)
        self._drain_output(runner)
        self._unregister(runner)
        if runner.slot is not None:
            runner.slot.remove()  # outcome() answers from a snapshot afterwards
        runner.status = status
        if runner.task is not None and not runner.handed_over:
            runner.handed_over = True
            self.finished.put(runner)
            self.on_change()
            self.fill()
            return
        with self._lock:
            if runner in self._idle:
                self._idle.remove(runner)
                log.warning("idle runner %d died (%s); forking another", pid,
                            describe_status(status))
        if runner.task is None:
            _close(runner)
        self.fill()

    def _on_channel(self, runner: Runner) -> None:
        frame = protocol.recv(runner.channel)
        if frame is None:
            self._unregister_one(runner.channel)
            return
        if frame.get("mode") == "exec":
            runner.exec_mode = True
            return
        runner.report = frame
        runner.tasks_done += 1
        if self.max_tasks > 1 and runner.task is not None and not runner.handed_over:
            runner.handed_over = True  # a reusable runner's run ends with its report
            self.finished.put(runner)
            self.on_change()

    def _drain_channel(self, runner: Runner) -> None:
        """Read a report sent just before exiting, which may still sit in the socket."""
        runner.channel.setblocking(False)
        try:
            while (frame := protocol.recv(runner.channel)) is not None:
                if frame.get("mode") == "exec":
                    runner.exec_mode = True
                else:
                    runner.report = frame
        except BlockingIOError:
            return

    def _on_output(self, runner: Runner) -> None:
        data = os.read(runner.output, 65536)
        if not data:
            self._unregister_one(runner.output)
            return
        lines = (runner._partial + data).split(b"\n")
        runner._partial = lines.pop()
        for line in lines:
            self._log_line(runner, line)

    def _drain_output(self, runner: Runner) -> None:
        """Read what the runner printed just before exiting, so no line is lost."""
        try:
            os.set_blocking(runner.output, False)
            while data := os.read(runner.output, 65536):
                runner._partial += data
        except (BlockingIOError, OSError):
            pass
        for line in runner._partial.split(b"\n"):
            if line:
                self._log_line(runner, line)
        runner._partial = b""

    def _log_line(self, runner: Runner, line: bytes) -> None:
        label = getattr(runner.task, "log_label", f"runner={runner.pid}")
        task_log.info("%s %s", label, line.decode(errors="replace"))

    def _unregister(self, runner: Runner) -> None:
        self._unregister_one(runner.channel)
        self._unregister_one(runner.output)

    def _unregister_one(self, fileobj: socket.socket | int) -> None:
        try:
            self._selector.unregister(fileobj)
        except (KeyError, ValueError):
            return


def _close(runner: Runner) -> None:
    """Close a runner's descriptors and remove its cgroup once nothing more can come."""
    if runner.closed:
        return
    runner.closed = True
    if runner.slot is not None:
        runner.slot.remove()
    runner.channel.close()
    for fd in (runner.output, runner.pidfd):
        try:
            os.close(fd)
        except OSError:
            continue


def describe_status(status: int | None) -> str:
    if status is None:
        return "unknown"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"
