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
If the supervisor goes away (EOF), the zygote kills every runner it forked and exits.

Why the lane replaces runners by itself: a fork server pays a copy-on-write fault for every
page it writes while a child still shares it, so the less Python it runs between forks the
cheaper each fork. One wake-up per task (the runner's exit: reap, fork its replacement,
one frame) instead of two (exit; then the supervisor's request for a new runner) halved
the lane's work per task. Its frames are formatted without the JSON encoder for the same
reason.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import socket
import sys
from typing import NoReturn

from conveyor.worker import frames, warmup
from conveyor.worker.isolation import die_with_parent, make_non_dumpable
from conveyor.worker.runner import (
    RunnerConfig,
    join_cgroup,
    prepare_lane,
    protect_from_oom_killer,
    runner_main,
)


class Zygote:
    """A fork server: the zygote (its children are lanes) or a lane (runners).

    Each child is watched through a pidfd of its own, not a SIGCHLD handler: a handler is
    Python code the fork server runs for every exit (and so copy-on-write faults it pays
    while runners share its pages), and a runner would have to reset it before its task.
    """

    def __init__(self, control: socket.socket, config: RunnerConfig) -> None:
        self.control = control
        self.config = config
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.replace = False  # a lane, once asked for runners: replace each that exits
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
        for fd in fds:
            os.close(fd)
        return True

    def _forked(self) -> bool:
        """Fork; in the child, drop the parent's descriptors."""
        pid = os.fork()
        if pid == 0:
            self.control.close()
            for pidfd in self.children:
                os.close(pidfd)
            return True
        self._watch(pid)
        return False

    def _watch(self, pid: int) -> int:
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self._poll.register(pidfd, select.POLLIN)
        return pidfd

    def _lane(self, control_fd: int, cgroup_procs: str) -> None:
        """Fork a lane: a fork server of its own, parked for good in the lane's cgroup."""
        if not self._forked():
            return
        control = socket.socket(fileno=os.dup(control_fd))
        die_with_parent()
        join_cgroup(cgroup_procs)
        protect_from_oom_killer()
        prepare_lane()
        frames.send(control, {"op": "ready", "pid": os.getpid()})
        Zygote(control, self.config).serve()

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
        if not self.replace:
            self._tell(b'{"op":"exited","pid":%d,"status":%d}' % (pid, status), [])
            return
        new, theirs = self._spawn()
        self._tell(b'{"op":"exited","pid":%d,"status":%d,"spawned":%d}' % (pid, status, new),
                   theirs)

    def _shutdown(self) -> NoReturn:
        for pidfd in self.children:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                continue
        os._exit(0)


def main(argv: list[str] | None = None) -> NoReturn:
    make_non_dumpable()  # exec reset it; lanes and runners inherit it across fork
    parser = argparse.ArgumentParser(prog="conveyor-zygote")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--app", action="append", default=[])
    parser.add_argument("--max-tasks", type=int, default=1)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    args = parser.parse_args(argv)
    die_with_parent()
    # Children are reaped through pidfds: an inherited SIG_IGN would have the kernel reap
    # them first, and their exit statuses (a task's outcome) would be lost.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control = socket.socket(fileno=args.control_fd)
    for module in args.app:
        importlib.import_module(module)
    warmup.warm()  # what every runner would otherwise redo: name service, caches, imports
    warmup.freeze()  # forked runners share these pages instead of copying them on first GC
    frames.send(control, {"op": "ready", "pid": os.getpid()})
    Zygote(control, RunnerConfig(args.max_tasks, args.uid, args.gid)).serve()


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
