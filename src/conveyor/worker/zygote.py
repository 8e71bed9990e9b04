"""The zygote: a small, single-threaded process that forks task runners on request.

Why a separate process: the supervisor talks to brokers, serves /metrics and watches
runners from threads, and forking a multi-threaded process can deadlock the child. The
zygote is exec'd (not forked) by the supervisor with a scrubbed environment, imports the
user's task modules once, freezes the GC so forks share those pages, and then only ever
forks. No broker URL, password or signing key ever exists in its memory, so no runner can
find one in its own address space either.

Protocol on its control socket (SOCK_SEQPACKET, JSON frames):
  supervisor -> zygote  {"op": "lane", "cgroup_procs": PATH} + fds [lane control]: fork a
                        lane, a zygote of its own that joins that cgroup once and serves
                        the same protocol on its control socket (pool.py says why)
  supervisor -> lane    {"op": "spawn", "count": N}: fork N runners, and from then on fork
                        a replacement for every runner that exits, at once
  lane -> supervisor    {"op": "spawned", "spawned": P} + fds [pidfd of P, P's channel,
                        P's output pipe (read end)]
  lane -> supervisor    {"op": "exited", "pid": P, "status": S[, "spawned": Q]} (raw
                        waitpid status) + fds [Q's as above] when Q replaces P
  zygote -> supervisor  {"op": "exited", "pid": P, "status": S}   (a lane died)
  supervisor -> zygote  {"op": "hold"} + fds [a socket]: keep this descriptor open until
                        every runner is gone (see below); replaces the one held before
  supervisor -> zygote  {"op": "sentinel"} + fds [memfd]: once every lane is open, fork the
                        sentinel (sentinel.py), which kills every runner as soon as the
                        supervisor starts dying

When the supervisor goes away (EOF on the control sockets, the moment its descriptors close,
whether it exited or was SIGKILLed), each lane SIGKILLs its runners and waits until every one
has exited, then exits; the zygote waits until every lane has exited (a lane stopped or
hung is killed after LANE_GRACE seconds), then exits. So the
zygote outlives every runner, and the socket it holds outlives the zygote's: the supervisor
hands it the broker connection whose close makes the broker redeliver at once (RabbitMQ),
and the broker sees that connection close only once no runner of the dead worker can still
act (a SIGKILLed supervisor's own descriptors close before anything else learns of its
death). The zygote therefore has no parent-death signal once it serves (only while it
starts, when it has no children and holds nothing); lanes and runners keep theirs (SIGKILL
when their parent dies) for the case where a fork server itself is killed.

Why the lane replaces runners by itself: a fork server pays a copy-on-write fault for every
page it writes while a child still shares it, so the less Python it runs between forks the
cheaper each fork. One wake-up per task (the runner's exit: reap, fork its replacement,
one frame) instead of two (exit; then the supervisor's request for a new runner) halved
the lane's work per task. Its frames are formatted without the JSON encoder for the same
reason.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import sys
import time
from typing import NoReturn

from conveyor.worker import frames, sentinel, warmup
from conveyor.worker.apps import import_app
from conveyor.worker.isolation import die_with_parent, make_non_dumpable
from conveyor.worker.runner import (
    RunnerConfig,
    join_cgroup,
    prepare_lane,
    protect_from_oom_killer,
    runner_main,
)

#: Seconds the zygote waits for its lanes once the supervisor is gone, then kills them.
LANE_GRACE = 5.0


class Zygote:
    """A fork server: the zygote (its children are lanes) or a lane (runners).

    Each child is watched through a pidfd of its own, not a SIGCHLD handler: a handler is
    Python code the fork server runs for every exit (and so copy-on-write faults it pays
    while runners share its pages), and a runner would have to reset it before its task.
    """

    def __init__(self, control: socket.socket, config: RunnerConfig,
                 lane: bool = False) -> None:
        self.control = control
        self.config = config
        self.lane = lane  # a lane's children are runners; the zygote's are lanes
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.replace = False  # a lane, once asked for runners: replace each that exits
        self.held = -1  # the descriptor "hold" gave (the zygote only)
        self.sentinel = -1  # the sentinel's pidfd (the zygote only)
        self.lanes: dict[int, str] = {}  # lane pid -> its cgroup.procs ("": none)
        self._poll = select.poll()
        self._poll.register(control, select.POLLIN)

    def serve(self) -> NoReturn:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        control = self.control.fileno()
        while True:
            for fd, _ in self._poll.poll():
                if fd != control:
                    self._reap(fd)
                elif not self._handle_request():
                    self._shutdown()

    def _handle_request(self) -> bool:
        frame, fds = frames.recv_with_fds(self.control)
        if frame is None:
            return False
        if frame.get("op") == "spawn":
            self.replace = True
            for _ in range(frame.get("count", 1)):
                pid, theirs = self._spawn()
                self._tell(b'{"op":"spawned","spawned":%d}' % pid, theirs)
        elif frame.get("op") == "lane" and len(fds) == 1:
            self._lane(fds[0], frame.get("cgroup_procs", ""))
        elif frame.get("op") == "sentinel" and len(fds) == 1:
            self._sentinel(fds[0])
        elif frame.get("op") == "hold" and len(fds) == 1:
            if self.held >= 0:
                os.close(self.held)
            self.held = fds.pop()
        for fd in fds:
            os.close(fd)
        return True

    def _forked(self) -> int:
        """Fork: in the child 0, its parent's descriptors dropped; here the child's pidfd."""
        pid = os.fork()
        if pid == 0:
            self.control.close()
            for fd in [*self.children, self.held]:
                if fd >= 0:
                    os.close(fd)
            self.held = -1
            return 0
        return self._watch(pid)

    def _watch(self, pid: int) -> int:
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self._poll.register(pidfd, select.POLLIN)
        return pidfd

    def _lane(self, control_fd: int, cgroup_procs: str) -> None:
        """Fork a lane: a fork server of its own, parked for good in the lane's cgroup."""
        pidfd = self._forked()
        if pidfd:
            self.lanes[self.children[pidfd]] = cgroup_procs
            return
        control = socket.socket(fileno=os.dup(control_fd))
        die_with_parent()
        join_cgroup(cgroup_procs)
        protect_from_oom_killer()
        prepare_lane()
        frames.send(control, {"op": "ready", "pid": os.getpid()})
        Zygote(control, self.config, lane=True).serve()

    def _sentinel(self, memfd: int) -> None:
        """Fork the sentinel, watching the lanes forked so far (all of them)."""
        lanes = dict(self.lanes)
        pidfd = self._forked()
        if pidfd:
            self.sentinel = pidfd
            return
        die_with_parent()
        sentinel.watch(memfd, lanes)

    def _spawn(self) -> tuple[int, list[int]]:
        """Fork a runner with a channel and an output pipe of its own: (its pid, the
        supervisor's descriptors for it: pidfd, channel, output read end)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the runner closes every inherited descriptor it does not need
            runner_main(theirs, out_w, self.config)
        theirs.close()
        os.close(out_w)
        return pid, [self._watch(pid), ours.detach(), out_r]

    def _tell(self, frame: bytes, fds: list[int]) -> None:
        """Send a frame with descriptors; all but the first (the pidfd this process keeps
        watching) are then closed here."""
        try:
            if fds:
                socket.send_fds(self.control, [frame], fds)
            else:
                self.control.send(frame)
        except OSError:  # the supervisor's end closed since this wake-up began
            self._shutdown()
        finally:
            for fd in fds[1:]:
                os.close(fd)

    def _reap(self, pidfd: int) -> None:
        """A watched child's pidfd is readable: it exited (reaped here, so not before)."""
        pid = self.children.get(pidfd)
        if pid is None:
            return
        reaped, status = os.waitpid(pid, os.WNOHANG)
        if reaped == 0:
            return  # a new child got a closed pidfd's number in the same poll batch
        del self.children[pidfd]
        self._poll.unregister(pidfd)
        os.close(pidfd)
        if pidfd == self.sentinel:
            self.sentinel = -1
            self._tell(b'{"op":"exited","pid":%d,"status":%d,"role":"sentinel"}'
                       % (pid, status), [])
            return
        if not self.replace:
            self._tell(b'{"op":"exited","pid":%d,"status":%d}' % (pid, status), [])
            return
        new, theirs = self._spawn()
        self._tell(b'{"op":"exited","pid":%d,"status":%d,"spawned":%d}' % (pid, status, new),
                   theirs)

    def _shutdown(self) -> NoReturn:
        """The supervisor is gone: a lane kills its runners; either kind of fork server
        then waits for every child to exit before it exits (the module docstring says why).
        Blocking here is the point: a child SIGKILLed cannot refuse to die, and a lane
        waits for nothing but its runners."""
        if self.sentinel >= 0:  # the lanes see to their runners from here
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.sentinel, signal.SIGKILL)
        if self.lane:
            self._kill_children()
        else:
            self._wait_for_children(LANE_GRACE)
            self._kill_children()   # a lane stopped or hung past the grace
        for pid in self.children.values():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                continue
        os._exit(0)


    def _kill_children(self) -> None:
        for pidfd in self.children:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def _wait_for_children(self, grace: float) -> None:
        """Wait up to `grace` seconds for every child to exit (each pidfd readable). A lane
        that cannot act on its supervisor's death (stopped, or hung) would otherwise keep
        this process, and the connection it holds, for ever: its runners are gone by then
        (the sentinel's kill, or their parent-death signal when the lane is killed)."""
        waiting = select.poll()
        for pidfd in self.children:
            waiting.register(pidfd, select.POLLIN)
        left, deadline = len(self.children), time.monotonic() + grace
        while left and (remaining := deadline - time.monotonic()) > 0:
            for pidfd, _ in waiting.poll(remaining * 1000):
                waiting.unregister(pidfd)
                left -= 1


def main(argv: list[str] | None = None) -> NoReturn:
    make_non_dumpable()  # exec reset it; lanes and runners inherit it across fork
    parser = argparse.ArgumentParser(prog="conveyor-zygote")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--app", action="append", default=[])
    parser.add_argument("--max-tasks", type=int, default=1)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args(argv)
    die_with_parent()  # while it starts (an app's import may hang); cleared once serving
    if args.parent and os.getppid() != args.parent:
        os._exit(0)  # the worker died before the line above: no signal is coming
    # Children are reaped through pidfds: an inherited SIG_IGN would have the kernel reap
    # them first, and their exit statuses (a task's outcome) would be lost.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control = socket.socket(fileno=args.control_fd)
    for app in args.app:
        import_app(app)   # the supervisor imported them first: a bad --app stopped it there
    warmup.warm()  # what every runner would otherwise redo: name service, caches, imports
    warmup.freeze()  # forked runners share these pages instead of copying them on first GC
    frames.send(control, {"op": "ready", "pid": os.getpid()})
    die_with_parent(0)  # from here EOF ends it, after its lanes (see the module docstring)
    Zygote(control, RunnerConfig(args.max_tasks, args.uid, args.gid)).serve()


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
