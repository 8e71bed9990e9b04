"""The sentinel: runners die the moment their supervisor starts dying, not once it is gone.

The kernel tears a dying process down in order (do_exit): each thread's robust futexes are
released first, then its memory is unmapped, then its descriptors are closed, and only then
are its children sent their parent-death signal and its pidfd made readable. Unmapping a
worker supervisor's ~25 MB took 3-8 ms here, more under load, and it all came before a lane
could see EOF on its control socket: its runner ran on for that long.

So the supervisor holds a robust, process-shared mutex in a page of shared memory (a memfd)
from a thread of its own that lives as long as the process (`Tether`), and a small process
forked by the zygote once every lane is open, the sentinel, blocks locking it (`watch`).
When any death ends the holding thread (SIGKILL included) the kernel marks the mutex
owner-dead and wakes the sentinel first thing, and the sentinel SIGKILLs every runner at
once: each lane's children, read from /proc. A deliberate release (the pool closing) does
the same. The lanes' EOF path (zygote.py) follows as before: they reap the runners, and the
zygote, which holds the broker connection that would redeliver at once, exits after them.

Each step of that is a process that must get a CPU, and on a loaded machine a woken process
waits its turn: the supervisor's holding thread, the sentinel, and each runner SIGKILLed
(which still has to run its own exit). Where the worker may (root, or CAP_SYS_NICE), all
three run it at SCHED_FIFO priority: the thread and the sentinel are asleep until the one
moment they matter, and a runner is raised only after its SIGKILL, so it can never again run
user code, only its exit. A worker without the capability may do the same under an
RLIMIT_RTPRIO of 1 or more (the kernel checks the limit of the process being raised, which
runners inherit, and raises another's only if it has the same uid: runners under `--uid`
stay at their priority). Without either they keep their ordinary priority, and the worker's
start line says which (`describe`).

Runners never hold the memfd (lanes are forked before the zygote receives it), so no task
can touch the mutex.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import resource
import signal
import threading
from collections.abc import Callable
from typing import NoReturn

from conveyor.worker.isolation import IsolationError, libc

#: The sentinel's process name (/proc/<pid>/comm, 15 characters at most).
NAME = "conveyor-sentry"
PR_SET_NAME = 15
PTHREAD_PROCESS_SHARED = 1
PTHREAD_MUTEX_ROBUST = 1
#: Bytes for a pthread_mutexattr_t / pthread_mutex_t: glibc's are 4 and 40 on x86-64 and
#: 8 and 48 on arm64; these leave room.
_ATTR_BYTES, _MUTEX_BYTES = 64, 128


class Tether:
    """The supervisor's end: a robust mutex locked by a thread that waits for `close`."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("conveyor-tether", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, mmap.PAGESIZE)
        self._map = mmap.mmap(self.fd, mmap.PAGESIZE)
        self._mutex = (ctypes.c_char * _MUTEX_BYTES).from_buffer(self._map)
        _init_robust(ctypes.addressof(self._mutex))
        self._locked, self._release = threading.Event(), threading.Event()
        self.realtime = False  # whether the holding thread got SCHED_FIFO (so may the rest)
        self._thread = threading.Thread(target=self._hold, name="tether", daemon=True)
        self._thread.start()
        self._locked.wait()

    def _hold(self) -> None:
        """Lock, then wait: this thread ends only when the process does, or at `close`."""
        address = ctypes.addressof(self._mutex)
        self.realtime = realtime(0)
        _lock(address)
        self._locked.set()
        self._release.wait()
        libc.pthread_mutex_unlock(ctypes.c_void_p(address))

    def close(self) -> None:
        """Let go (a sentinel still watching kills the runners and exits)."""
        self._release.set()
        self._thread.join()
        del self._mutex
        self._map.close()
        os.close(self.fd)


def watch(fd: int, lanes: dict[int, str]) -> NoReturn:
    """The sentinel's life: wait until the supervisor lets go of the mutex in `fd` (dies,
    or closes its pool), SIGKILL the runners of `lanes` (lane pid -> its cgroup.procs, or
    "") and what their tasks started, exit."""
    shared = mmap.mmap(fd, mmap.PAGESIZE)
    os.close(fd)
    # its name in ps and top; prctl, as /proc/self/comm is root's in a non-dumpable process
    name = ctypes.create_string_buffer(NAME.encode())
    libc.prctl(PR_SET_NAME, ctypes.addressof(name), 0, 0, 0)
    realtime(0)
    _lock(ctypes.addressof(ctypes.c_char.from_buffer(shared)))
    for lane in lanes:  # the runners first: one small read per lane
        _kill(_pids(f"/proc/{lane}/task/{lane}/children"))
    for lane, procs in lanes.items():  # then whatever else is in the lane's cgroup: what
        if procs:                      # tasks started (their parents may be gone by now)
            _kill(_pids(procs) - {lane})
    os._exit(0)


def _pids(listing: str) -> set[int]:
    """The pids in a /proc children file or a cgroup.procs (none if it is gone: a lane that
    died took its runners with it, by their parent-death signal)."""
    try:
        with open(listing, "rb") as pids:
            return {int(pid) for pid in pids.read().split()}
    except OSError:
        return set()


def _kill(pids: set[int]) -> None:
    """SIGKILL each; a pid gone meanwhile is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        realtime(pid)  # after the kill: it can only die now, and does so first


def realtime(pid: int) -> bool:
    """SCHED_FIFO for `pid` (0: the calling thread), at the lowest real-time priority (any
    beats every ordinary task, and 1 is all an RLIMIT_RTPRIO of 1 allows), not inherited by
    children; False if not permitted (no CAP_SYS_NICE and RLIMIT_RTPRIO 0, or a kernel that
    refuses real-time tasks in this cgroup)."""
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                              os.sched_param(1))
    except OSError:
        return False
    return True


def describe(raised: bool, runners_uid: int | None) -> str:
    """For the worker's start line: whether its runners die at real-time priority, and if
    not, what would put them there."""
    if not raised and not has_sys_nice() and resource.getrlimit(resource.RLIMIT_RTPRIO)[0] < 1:
        return ("ordinary priority (no CAP_SYS_NICE and RLIMIT_RTPRIO 0: give the worker "
                "RLIMIT_RTPRIO 1 for the real-time path; README, 'runner gone')")
    if not raised:
        return ("ordinary priority (the kernel refused SCHED_FIFO to a permitted worker: "
                "real-time group scheduling without runtime for its cgroup?)")
    if runners_uid not in (None, os.geteuid()) and not has_sys_nice():
        return "real-time, runners at ordinary priority (--uid without CAP_SYS_NICE)"
    return "real-time"


def has_sys_nice() -> bool:
    """Whether this process has CAP_SYS_NICE in its effective set."""
    CAP_SYS_NICE = 23
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except OSError:
        pass
    return False


def _init_robust(address: int) -> None:
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    steps: tuple[tuple[str, Callable[[], int]], ...] = (
        ("init", lambda: libc.pthread_mutexattr_init(attr)),
        ("setpshared", lambda: libc.pthread_mutexattr_setpshared(attr, PTHREAD_PROCESS_SHARED)),
        ("setrobust", lambda: libc.pthread_mutexattr_setrobust(attr, PTHREAD_MUTEX_ROBUST)),
        ("mutex_init", lambda: libc.pthread_mutex_init(ctypes.c_void_p(address), attr)))
    for step, call in steps:
        code = call()
        if code != 0:
            raise IsolationError(f"pthread_{step} failed for the worker's tether: "
                                 f"{os.strerror(code)}; runners could outlive a killed worker")
    libc.pthread_mutexattr_destroy(attr)


def _lock(address: int) -> int:
    """pthread_mutex_lock: 0, or EOWNERDEAD when the holder died holding it (the point)."""
    code: int = libc.pthread_mutex_lock(ctypes.c_void_p(address))
    if code not in (0, errno.EOWNERDEAD, errno.ENOTRECOVERABLE):
        raise IsolationError(f"pthread_mutex_lock on the worker's tether failed: "
                             f"{os.strerror(code)}")
    return code


__all__ = ["NAME", "Tether", "describe", "has_sys_nice", "realtime", "watch"]
