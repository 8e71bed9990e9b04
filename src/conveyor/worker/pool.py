"""The runner pool: the zygote, one lane per slot, runners forked ahead, and a watcher.

Each slot is a *lane*: a memory cgroup of its own holding a small fork server (forked once
from the zygote, parked in that cgroup) and the runners it forks ahead of need. Runners are
born inside their lane's cgroup, so no task waits for a cgroup migration (each one waits
for a kernel RCU grace period, and they are serialised machine-wide), and lanes fork in
parallel. One task runs in a lane at a time; its cap is written when it starts, its OOM
kills are the lane counter's increase, and whatever it leaves behind is killed when it ends.
Idle runners sit at oom_score_adj -1000, so the kernel's OOM killer only ever picks the task.

The supervisor's main thread asks the pool for an idle runner, hands it a task and later
collects it from `finished`. A watcher thread reads everything runners and lanes send
(reports, exit statuses, stdout/stderr lines) and calls `on_change` so the main thread
reacts at once instead of polling.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from conveyor.errors import ConfigError
from conveyor.worker import frames
from conveyor.worker.cgroups.base import MemoryCaps, Slot, read_text
from conveyor.worker.sentinel import Tether, describe
from conveyor.worker.spawn import Zygote, expect_ready, spawn_zygote

log = logging.getLogger("conveyor.worker")
#: Lines of a task's output kept for its outcome event, and the characters kept of each:
#: enough to see why it failed, small enough for any broker's message size.
LOG_TAIL_LINES, LOG_TAIL_WIDTH = 50, 500
task_log = logging.getLogger("conveyor.task")


class Task(Protocol):
    """What the pool knows of the task a runner runs: the supervisor's record of it (a
    `Run`), compared by identity and named in log lines."""

    @property
    def log_label(self) -> str: ...


@dataclass(eq=False)
class Runner:
    """One forked runner and whatever task it is running."""

    pid: int
    pidfd: int
    channel: socket.socket
    output: int
    lane: Lane | None = None  # where it was born, and runs its task
    task: Task | None = None  # the supervisor's record of the task running here
    started: float = 0.0
    ended: float = 0.0  # time.monotonic() when its run was handed over (reported or exited)
    report: dict[str, Any] | None = None
    exec_mode: bool = False
    status: int | None = None  # raw waitpid status once it has exited
    tasks_done: int = 0
    last_line: str = ""  # its last line of output: why it died, if it exits unreported
    #: the current task's last lines of output, sent with its outcome (the dashboard shows them)
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES), repr=False)
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


@dataclass(eq=False)
class Lane:
    """One slot: a fork server parked in a memory cgroup, and its warm runners."""

    index: int
    control: socket.socket
    slot: Slot  # the lane's memory cgroup (or the rlimit fallback)
    pid: int = 0
    idle: collections.deque[Runner] = field(default_factory=collections.deque)
    busy: Runner | None = None
    procs_file: str = ""  # its cgroup.procs (precomputed: read after every task)
    oom_baseline: int | None = None  # the OOM counter when its last task ended, if read
    limit: int | None = None  # the cap written for its last task (cgroups keep it)


class RunnerPool(Protocol):
    """What the supervisor uses of its runner pool: `Pool`, or a unit test's fake."""

    failure: str | None
    finished: queue.SimpleQueue[Runner]
    teardown: str  # at what priority a killed worker's runners die (sentinel.describe)

    def take(self) -> Runner | None: ...

    def start(self, runner: Runner, task: Task, frame: dict[str, Any],
              memory_limit: int) -> None: ...

    def live(self, runner: Runner, task: Task) -> contextlib.AbstractContextManager[bool]: ...

    def hold(self, connection: socket.socket) -> None: ...

    def usage(self) -> list[tuple[Lane, Task | None, int | None]]: ...

    def oom_killed(self, runner: Runner) -> bool: ...

    def release(self, runner: Runner) -> None: ...

    def abandon(self, runner: Runner) -> None: ...

    def close(self) -> None: ...


class Pool:
    """Keeps runners forked ahead in every lane and tells the supervisor when runs finish."""

    def __init__(self, apps: list[str], env: Mapping[str, str], on_change: Callable[[], None],
                 caps: MemoryCaps, max_tasks_per_child: int = 1, uid: int | None = None,
                 gid: int | None = None, lanes: int = 1, warm: int = 2,
                 zygote: Zygote | None = None,
                 on_request: Callable[[socket.socket, dict[str, Any], str | None], None]
                 | None = None
                 ) -> None:
        """`zygote`: one `spawn_zygote` started earlier with the same apps, environment,
        tasks per child and user (the worker starts it first thing, so its start-up
        overlaps the supervisor's own); by default one is started here. `on_request`: a
        runner asks for something besides reporting (a follow-up to publish: see
        worker/followups.py), called on the watcher thread with its channel, the frame and
        the log label of the task running there (None: no task, a `worker_process_init`
        hook asks)."""
        self.on_change = on_change
        self.on_request = on_request
        self.caps = caps
        self.max_tasks = max_tasks_per_child
        self.warm = warm
        self._lock = threading.Lock()
        self.finished: queue.SimpleQueue[Runner] = queue.SimpleQueue()
        self._selector = selectors.DefaultSelector()
        self._stopping = False
        self.failure: str | None = None
        self._by_pid: dict[int, Runner] = {}
        self._wanted = False  # take() found no runner: tell the supervisor when one is born
        self._zygote, self._control = self._await_zygote(
            zygote or spawn_zygote(apps, env, max_tasks_per_child, uid, gid))
        self.lanes = [self._open_lane(i) for i in range(lanes)]
        self._tether = Tether()  # its sentinel kills the runners as this process dies
        frames.send(self._control, {"op": "sentinel"}, [self._tether.fd])
        #: for the start line: whether runners die at real-time priority (sentinel.py)
        self.teardown = describe(self._tether.realtime, uid)
        self._watcher = threading.Thread(target=self._watch, name="runner-watcher", daemon=True)
        self._watcher.start()
        for lane in self.lanes:  # from now on each lane replaces every runner that exits
            frames.send(lane.control, {"op": "spawn", "count": warm})

    # -- the zygote and its lanes ----------------------------------------------------------

    @staticmethod
    def _await_zygote(zygote: Zygote) -> tuple[subprocess.Popen[bytes], socket.socket]:
        """Wait for the zygote's ready frame; say why it failed to start if it did not."""
        proc, ours = zygote.proc, zygote.control
        ready = expect_ready(ours)
        if ready is None:
            proc.wait(10)
            detail = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise ConfigError(f"the runner zygote failed to start (exit {proc.returncode}): "
                              f"{detail.splitlines()[-1] if detail else 'no output'}")
        assert proc.stderr is not None
        proc.stderr.close()
        return proc, ours

    def _open_lane(self, index: int) -> Lane:
        """Fork a lane's fork server into the lane's own cgroup (one migration, at start)."""
        slot = self.caps.prepare(f"{os.getpid()}-lane{index}", 0)
        ours, theirs = frames.pair()
        procs = str(slot.path / "cgroup.procs") if slot.path is not None else ""
        try:
            frames.send(self._control, {"op": "lane", "cgroup_procs": procs},
                          [theirs.fileno()])
        finally:
            theirs.close()
        ready = expect_ready(ours)
        if ready is None:
            raise ConfigError(f"runner lane {index} failed to start: see the log above")
        return Lane(index, ours, slot, pid=ready["pid"], procs_file=procs)

    # -- the supervisor's side ----------------------------------------------------------------

    def take(self) -> Runner | None:
        """A warm runner in a lane with no task, or None if none is ready yet."""
        with self._lock:
            for lane in self.lanes:
                if lane.busy is None and lane.idle:
                    lane.busy = lane.idle.popleft()
                    return lane.busy
            self._wanted = True  # the next runner born wakes the supervisor
        return None

    def start(self, runner: Runner, task: Task, frame: dict[str, Any], memory_limit: int) -> None:
        """Cap the lane for this task, note its OOM counter, and hand the runner the task."""
        lane = runner.lane
        assert lane is not None
        if lane.oom_baseline is None:  # else: read when its last task ended
            lane.oom_baseline = lane.slot.oom_kills() or 0
        if lane.slot.path is None:
            lane.slot.set_limit(memory_limit)
            lane.slot.admit(runner.pid)  # the rlimit fallback caps the process itself
        elif lane.limit != memory_limit:  # the cgroup keeps it: a file write only on change
            lane.slot.set_limit(memory_limit)
            lane.limit = memory_limit
        with self._lock:  # the watcher must not see a task on a runner that never got it
            runner.task, runner.started, runner.report = task, time.monotonic(), None
            runner.exec_mode = runner.handed_over = False
            runner.last_line = ""
            runner.tail.clear()
            try:
                frames.send_task(runner.channel, frame)
            except (OSError, frames.FrameTooLarge):
                runner.task = None
                raise

    @contextlib.contextmanager
    def live(self, runner: Runner, task: Task) -> Iterator[bool]:
        """Whether `runner` still runs `task`, held true for the `with` block (from any
        thread): a signal sent inside reaches that run, never a runner whose run is over
        nor a pidfd closed meanwhile. Keep the block short: the watcher waits for it."""
        with self._lock:
            yield runner.task is task and not runner.handed_over

    def hold(self, connection: socket.socket) -> None:
        """Have the zygote keep a duplicate of `connection` open until every runner is gone.

        Given the broker connection whose close makes the broker redeliver at once
        (RabbitMQ): if this process is SIGKILLed, its own descriptor closes before any
        other process can learn of the death, and without the duplicate the broker would
        hand the message to another worker while this one's runner still ran. Only the
        zygote holds it: lanes close it right after their fork, and runners are forked by
        lanes. A deliberate close still ends the connection: pika shuts the socket down
        before closing it, which ends it whoever else holds it. Thread-safe (one send)."""
        try:
            frames.send(self._control, {"op": "hold"}, [connection.fileno()])
        except OSError:
            return  # the zygote is gone: the watcher has seen it and stops the worker

    def usage(self) -> list[tuple[Lane, Task | None, int | None]]:
        """(lane, the task it runs or None, bytes charged to its cgroup now) for each lane.

        Safe from any thread (the worker registry's heartbeat reads it); the memory is read
        outside the lock, one small cgroup file per lane.
        """
        with self._lock:
            held = [(lane, lane.busy.task if lane.busy is not None else None)
                    for lane in self.lanes]
        return [(lane, task, lane.slot.usage()) for lane, task in held]

    def oom_killed(self, runner: Runner) -> bool:
        """Whether the kernel OOM-killed something in the runner's lane during its task.

        The counter read here is the next task's baseline: one cgroup read per task, not
        two (between tasks the lane holds only idle runners, which the OOM killer spares).
        """
        lane = runner.lane
        assert lane is not None
        baseline, lane.oom_baseline = lane.oom_baseline, lane.slot.oom_kills() or 0
        return lane.oom_baseline > (baseline or 0)

    def release(self, runner: Runner) -> None:
        """After a finished run: free the lane, kill what the task left behind, and send a
        reusable runner back to idle. A reusable runner that has run its last task exits by
        itself; descriptors of exited runners were unregistered by the watcher.
        """
        lane = runner.lane
        assert lane is not None
        runner.task = None
        with self._lock:
            ours = {pid for pid, r in self._by_pid.items() if r.lane is lane}
        _kill_leftovers(lane, ours)
        if runner.exited:
            _close(runner)
        with self._lock:  # one hand-off to the watcher per task, not two
            if not runner.exited and runner.tasks_done < self.max_tasks:
                lane.idle.appendleft(runner)
            lane.busy = None

    def abandon(self, runner: Runner) -> None:
        """A runner that died before it could take its task: free its lane, forget it."""
        lane = runner.lane
        assert lane is not None
        with self._lock:
            runner.task = None
            lane.busy = None

    def close(self) -> None:
        """Stop the zygote; its lanes die with it, and every runner with its lane."""
        self._stopping = True
        self._control.close()
        for lane in self.lanes:
            lane.control.close()
        try:
            self._zygote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._zygote.kill()
            self._zygote.wait()
        self._watcher.join(timeout=5)
        self._tether.close()
        for lane in self.lanes:
            lane.slot.destroy()

    # -- the watcher thread -------------------------------------------------------------------

    def _watch(self) -> None:
        self._selector.register(self._control, selectors.EVENT_READ, ("zygote", None))
        for lane in self.lanes:
            self._selector.register(lane.control, selectors.EVENT_READ, ("lane", lane))
        try:
            while not self._stopping:
                for key, _ in self._selector.select(timeout=1.0):
                    if self._selector.get_map().get(key.fd) is not key:
                        continue  # unregistered earlier in this same batch
                    kind, target = key.data
                    self._dispatch(kind, target)
        except Exception as exc:  # noqa: BLE001 - any watcher death must stop the worker
            if not self._stopping:
                log.exception("the runner watcher stopped unexpectedly")
                self._fail(f"the runner watcher stopped: {type(exc).__name__}: {exc}")

    def _fail(self, reason: str) -> None:
        """Fail fast: the supervisor sees `failure` and exits; a restart is clean."""
        self.failure = reason
        self._stopping = True
        self.on_change()

    def _dispatch(self, kind: str, target: Any) -> None:
        if kind == "zygote":
            self._on_zygote()
        elif kind == "lane":
            self._on_lane(target)
        elif kind == "channel":
            self._on_channel(target)
        else:
            self._on_output(target)

    def _on_zygote(self) -> None:
        """The zygote only speaks again if a lane or the sentinel died, or it is going away:
        all are fatal (without its sentinel, a killed worker's runners outlive it by its
        teardown; see sentinel.py)."""
        frame = frames.recv(self._control)
        if not self._stopping:
            what = "exited" if frame is None else (
                f"reported that its {frame.get('role', 'lane')} (pid {frame.get('pid')}) "
                f"exited: {describe_status(frame.get('status'))}")
            log.error("the runner zygote %s; stopping the worker", what)
            self._fail(f"the runner zygote {what}")

    def _on_lane(self, lane: Lane) -> None:
        """A lane forked a runner, or reaped one and (always, once started) forked its
        replacement: the exit and the birth come in one frame (see zygote.py)."""
        frame, fds = frames.recv_with_fds(lane.control, max_fds=3)
        if frame is None:
            if not self._stopping:
                log.error("runner lane %d exited unexpectedly; stopping the worker", lane.index)
                self._fail(f"runner lane {lane.index} exited unexpectedly")
            return
        if frame["op"] == "exited":
            self._on_exited(frame["pid"], frame["status"])
        if "spawned" in frame:  # a birth: alone, or with the exit it replaces
            self._on_spawned(lane, frame["spawned"], fds)

    def _on_spawned(self, lane: Lane, pid: int, fds: list[int]) -> None:
        pidfd, channel_fd, output = fds
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, channel_fd)
        os.set_blocking(output, False)  # only ever read here, after a wake-up or a report
        with self._lock:  # one step, so release() never sees it neither idle nor known
            runner = Runner(pid=pid, pidfd=pidfd, channel=channel, output=output, lane=lane)
            self._by_pid[pid] = runner
        self._selector.register(channel, selectors.EVENT_READ, ("channel", runner))
        self._selector.register(output, selectors.EVENT_READ, ("output", runner))
        with self._lock:
            lane.idle.append(runner)
            wanted, self._wanted = self._wanted, False
        if wanted:  # else nobody waits for it: waking the supervisor (and, on some brokers,
            self.on_change()  # interrupting its wait with a round trip) would be wasted work

    def _on_exited(self, pid: int, status: int) -> None:
        with self._lock:  # release() reads the table from the main thread
            runner = self._by_pid.pop(pid, None)
        if runner is None:
            return
        self._drain_channel(runner)
        self._drain_output(runner)
        self._unregister(runner)
        runner.status = status
        lane = runner.lane
        assert lane is not None
        if self._hand_over(runner):
            self.finished.put(runner)
            self.on_change()
            return
        with self._lock:
            if runner in lane.idle:
                lane.idle.remove(runner)
                log.warning("idle runner %d died (%s); its lane forks another", pid,
                            describe_status(status))
        if runner.task is None:
            _close(runner)

    def _on_channel(self, runner: Runner) -> None:
        try:
            frame = frames.recv(runner.channel)
        except frames.BadFrame as exc:
            self._garbled(runner, exc)
            return
        if frame is None:
            self._unregister_one(runner.channel)
            return
        if frame.get("mode") == "exec":
            runner.exec_mode = True
            return
        if "op" in frame:  # a request of the running task, not its report
            if self.on_request is not None:
                task = runner.task
                self.on_request(runner.channel, frame, None if task is None else task.log_label)
            return
        runner.report = frame
        runner.tasks_done += 1
        if runner.tasks_done >= self.max_tasks:
            # Its last task: it sends nothing more but exits, and `_on_exited` drains the
            # channel anyway, so stop watching it now rather than wake up for its EOF.
            self._unregister_one(runner.channel)
        if self._hand_over(runner):
            # A run ends with its report: the runner sends nothing after it but its exit, so
            # a fresh runner's exit and reaping stay off the slot's path (the lane's next
            # runner is already forked). Its output came first: log it under the task.
            self._drain_output(runner)
            self.finished.put(runner)
            self.on_change()

    def _hand_over(self, runner: Runner) -> bool:
        """Mark the runner's run over, once (its report or its exit, whichever comes first),
        and when: its duration ends here, not when the supervisor gets to it."""
        with self._lock:  # `live` must not signal a runner whose run is over
            if runner.task is None or runner.handed_over:
                return False
            runner.handed_over, runner.ended = True, time.monotonic()
            return True

    def _drain_channel(self, runner: Runner) -> None:
        """Read a report sent just before exiting, which may still sit in the socket."""
        runner.channel.setblocking(False)
        try:
            while (frame := frames.recv(runner.channel)) is not None:
                if frame.get("mode") == "exec":
                    runner.exec_mode = True
                elif "op" not in frame:  # a dead task's last request has nobody to answer
                    runner.report = frame
        except BlockingIOError:
            return
        except frames.BadFrame as exc:
            self._garbled(runner, exc)

    def _garbled(self, runner: Runner, exc: frames.BadFrame) -> None:
        """A task wrote to its runner's channel what is not a frame: the runner is killed
        and its task fails saying so (the worker and its other runners go on)."""
        self._unregister_one(runner.channel)
        label = runner.task.log_label if runner.task is not None else "no task"
        log.warning("runner %d (%s) wrote to its channel what is not a frame (%s): killed",
                    runner.pid, label, exc)
        if runner.task is not None and not runner.handed_over:
            runner.report = {"outcome": "failed", "reason": f"the task wrote to its runner's "
                             f"channel what is not a frame ({exc}); the runner was killed",
                             "error": {"type": "BadFrame", "message": str(exc)}}
        runner.signal(signal.SIGKILL)

    def _on_output(self, runner: Runner) -> None:
        try:
            data = os.read(runner.output, 65536)
        except BlockingIOError:  # drained by a report or exit in the same wake-up
            return
        if not data:
            self._unregister_one(runner.output)
            return
        lines = (runner._partial + data).split(b"\n")
        runner._partial = lines.pop()
        for line in lines:
            self._log_line(runner, line)

    def _drain_output(self, runner: Runner) -> None:
        """Read what the runner printed before its report or exit, so no line is lost."""
        try:  # non-blocking since `_on_spawned`
            while data := os.read(runner.output, 65536):
                runner._partial += data
        except (BlockingIOError, OSError):
            pass
        for line in runner._partial.split(b"\n"):
            if line:
                self._log_line(runner, line)
        runner._partial = b""

    def _log_line(self, runner: Runner, line: bytes) -> None:
        task = runner.task
        label = task.log_label if task is not None else f"runner={runner.pid}"
        runner.last_line = line.decode(errors="replace")
        runner.tail.append(runner.last_line[:LOG_TAIL_WIDTH])
        task_log.info("%s %s", label, runner.last_line)

    def _unregister(self, runner: Runner) -> None:
        self._unregister_one(runner.channel)
        self._unregister_one(runner.output)

    def _unregister_one(self, fileobj: socket.socket | int) -> None:
        """Stop watching `fileobj` if it is still watched. Looked up first: a fresh runner's
        exit finds both its descriptors already unregistered (channel at its report, output
        at its EOF), and the selector's KeyError for those formats the socket's repr (a
        getsockname call), which profiled at ~5% of the supervisor's CPU per task."""
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._selector.get_map().get(fd) if fd >= 0 else None
        if key is None or key.fileobj is not fileobj:
            return
        try:
            self._selector.unregister(fileobj)
        except (KeyError, ValueError):
            return


def _kill_leftovers(lane: Lane, runners: set[int]) -> None:
    """SIGKILL processes a task left in its lane's cgroup (its own children, say).

    Everything in a lane is the lane's fork server, its runners (children of the fork
    server, announced or not), or what tasks forked. Only the last kind is killed. The
    runners the pool knows of (idle, reused, or exiting after their report) are spared
    without a look at /proc: usually nothing else is there, and this is on every task's path.
    """
    if lane.slot.path is None:
        return
    try:
        pids = {int(p) for p in read_text(lane.procs_file).split()}
    except OSError:
        return
    for pid in pids - runners - {lane.pid}:
        if _parent_of(pid) == lane.pid:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        log.warning("killed pid %d, left behind in lane %d by its last task", pid, lane.index)


def _parent_of(pid: int) -> int:
    """Its parent's pid. Read for 3 tasks in 4 (strace): a lane forks the next runner as the
    last one exits, usually before the supervisor has heard of it."""
    try:
        stat = read_text(f"/proc/{pid}/stat")
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _close(runner: Runner) -> None:
    """Close a runner's descriptors once nothing more can come from it."""
    if runner.closed:
        return
    runner.closed = True
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
