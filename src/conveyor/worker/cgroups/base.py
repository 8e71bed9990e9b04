"""What every kind of memory caps shares: errors, the outcome record, one-write cgroup
file helpers, and the Slot and MemoryCaps interfaces the supervisor uses.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from conveyor.errors import ConveyorError

log = logging.getLogger("conveyor.worker.cgroups")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_RMDIR_TIMEOUT = 2.0
_KILL_TIMEOUT = 5.0


class CgroupError(ConveyorError):
    """A task's cgroup could not be created, capped, entered, read or removed."""


class _Unavailable(Exception):
    """This kind of cgroup cannot be used here; the message says why (for the fallback log)."""


@dataclass(frozen=True)
class SlotOutcome:
    """What the kernel recorded about one task's cgroup.

    `oom_killed` comes from the cgroup's own oom_kill counter, never from the exit signal.
    `oom_kills` is None where the kernel keeps no such counter (cgroup v1 before Linux 4.13,
    and the rlimit fallback, where an over-cap task gets MemoryError instead of a kill).
    `peak_bytes` is the cgroup's high-water mark when the kernel reports one.
    """

    oom_killed: bool
    peak_bytes: int | None = None
    oom_kills: int | None = None


# -- small file helpers ---------------------------------------------------------------------


def read_text(path: Path | str) -> str:
    """A small kernel file's text with bare os calls: open, read until empty, close (a
    buffered `open()` adds four system calls, and this runs a few times per task)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _write(path: Path | str, text: str) -> None:
    """One write() call per value: cgroup files act on each write, so never buffer or split."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _set(path: Path, text: str) -> None:
    """`_write` with an error that names the file, the value and the kernel's answer."""
    try:
        _write(path, text)
    except OSError as exc:
        raise CgroupError(f"could not write {text!r} to {path}: {exc.strerror}") from exc


def _keyed(path: Path) -> dict[str, int]:
    """'key value' lines (memory.events, memory.oom_control) as a dict."""
    values: dict[str, int] = {}
    for line in read_text(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def _counter(path: str, key: str) -> int | None:
    """One counter of a 'key value' file (memory.events), None if the file lacks it."""
    prefix = key + " "
    for line in read_text(path).splitlines():
        if line.startswith(prefix):
            value = line[len(prefix):].strip()
            return int(value) if value.isdigit() else None
    return None


def _int_or_none(path: Path) -> int | None:
    try:
        return int(read_text(path))
    except (FileNotFoundError, ValueError):
        return None


def _pids(cgroup: Path) -> list[int]:
    """Processes in the cgroup (zombies are not listed: they no longer count)."""
    try:
        return [int(pid) for pid in read_text(cgroup / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmdir(path: Path, timeout: float = _RMDIR_TIMEOUT) -> None:
    """rmdir, retried while the kernel still releases processes that just exited (EBUSY):
    tenacity's Retrying, pausing 1 ms doubling to 50 ms, for up to `timeout` seconds."""
    retrying = Retrying(wait=wait_exponential(multiplier=0.001, max=0.05),
                        stop=stop_after_delay(timeout), retry=retry_if_exception(_busy),
                        reraise=True)
    try:
        retrying(_remove_dir, path)
    except OSError as exc:
        raise CgroupError(f"could not remove {path}: {exc.strerror}; still inside: "
                          f"{_pids(path) or 'no process'}") from exc


def _remove_dir(path: Path) -> None:
    """rmdir; a directory already gone is removed."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return


def _busy(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EBUSY


def _kill_until_empty(cgroup: Path, timeout: float = _KILL_TIMEOUT) -> int:
    """SIGKILL what the cgroup lists until it lists nothing; returns how many were signalled.

    Loops because a task may fork between our read of cgroup.procs and the signal; each
    round catches the newcomers, and a process that got SIGKILL forks no more.
    """
    signalled: set[int] = set()
    deadline, delay = time.monotonic() + timeout, 0.0005
    while pids := _pids(cgroup):
        if time.monotonic() >= deadline:
            raise CgroupError(f"processes {pids} in {cgroup} outlived SIGKILL for {timeout:.0f}s "
                              f"(stuck in the kernel, e.g. uninterruptible I/O)")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                signalled.add(pid)
            except ProcessLookupError:
                continue
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return len(signalled)



def _check_limit(name: str, memory_limit: int) -> None:
    if memory_limit < 0:
        raise CgroupError(f"memory limit {memory_limit} for {name!r} is negative: give bytes, "
                          f"or 0 for no cap")



# -- slots --------------------------------------------------------------------------------------


class Slot:
    """One lane's memory cgroup (or rlimit): prepared in the supervisor, entered by (or for)
    its fork server and runners, and capped for each task as it starts (`set_limit`).
    """

    kind = ""
    path: Path | None = None

    def __init__(self, name: str, memory_limit: int, forget: Callable[[str], None]) -> None:
        self.name = name
        self.memory_limit = memory_limit
        self._forget = forget

    def enter(self) -> None:
        """Put the calling process under this cap (call in the forked child, first thing)."""
        raise NotImplementedError

    def admit(self, pid: int) -> None:
        """Put process `pid` under this cap (supervisor side, for a runner forked ahead)."""
        raise NotImplementedError

    def set_limit(self, memory_limit: int) -> None:
        """Change the cap of a prepared (even already entered) slot; 0 = no cap.

        Cheap (a file write), unlike moving a process, which waits for an RCU grace period
        in the kernel (milliseconds): a supervisor can prepare and admit a slot while the
        runner is forked ahead and only set the task's cap here when the task arrives.
        """
        raise NotImplementedError

    def outcome(self) -> SlotOutcome:
        """The kernel's record of this task: OOM kills and peak memory."""
        raise NotImplementedError

    def oom_kills(self) -> int | None:
        """The kernel's OOM-kill counter of this slot alone (None where it keeps none).

        What the pool reads after every task to tell an OOM kill: `outcome()` also reads
        the peak-memory file, one more open/read/close that nothing on that path needs."""
        return self.outcome().oom_kills

    def usage(self) -> int | None:
        """Bytes of memory charged to this slot now (what its cap is held against), or None
        where it cannot be read. One small file read: cheap enough for every heartbeat."""
        return None

    def kill_all(self) -> int:
        """SIGKILL every process under this cap; returns how many were signalled."""
        raise NotImplementedError

    def remove(self) -> None:
        """Tear the slot down; `outcome()` keeps answering from a snapshot afterwards."""
        raise NotImplementedError

    def destroy(self) -> None:
        """Like remove(), but for shutdown: nothing under this cap survives, runner included."""
        self.remove()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} limit={self.memory_limit} {self.path}>"



# -- memory caps ---------------------------------------------------------------------------------


class MemoryCaps:
    """Where a worker's task runners get their memory caps; one per worker process.

    Named apart from flow control's `conveyor.limits.Limiter`, which has nothing to do
    with memory."""

    kind = ""

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._slots: dict[str, Slot] = {}
        self._lock = threading.Lock()
        self._closed = False

    def describe(self) -> str:
        """One line for the start-up log: what kind of cap tasks get, and where."""
        raise NotImplementedError

    def prepare(self, name: str, memory_limit: int) -> Slot:
        """A fresh slot (one per lane). `name` must be unique; 0 bytes = no cap."""
        if not _NAME.fullmatch(name):
            raise CgroupError(f"slot name {name!r} is not allowed: use 1-128 letters, digits, "
                              f"'_', '.', ':' or '-', starting with a letter or digit")
        _check_limit(name, memory_limit)
        with self._lock:
            if self._closed:
                raise CgroupError(f"cannot prepare {name!r}: these caps were closed")
            if name in self._slots:
                raise CgroupError(f"slot {name!r} is still open: names must be unique per task "
                                  f"(e.g. message id, attempt and delivery)")
            slot = self._new_slot(name, memory_limit)
            self._slots[name] = slot
        return slot

    def close(self) -> None:
        """Kill what still runs in open slots and remove every directory these caps made.

        Idempotent. Does nothing in a forked child: a runner must never tear down its
        worker's cgroups, even if its code ends up calling this. What cannot be cleaned up
        is logged at ERROR with its path, not raised: close() runs on shutdown paths, where
        an exception would skip the rest of the shutdown or hide the error that caused it.
        """
        if self._closed or os.getpid() != self._owner:
            return
        with self._lock:
            self._closed = True
            slots = list(self._slots.values())
        problems = []
        for slot in slots:
            try:
                slot.destroy()
            except CgroupError as exc:
                problems.append(str(exc))
        problems += self._teardown()
        for problem in problems:
            log.error("left behind on close: %s (remove it by hand once empty: rmdir)", problem)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._slots.pop(name, None)

    def _new_slot(self, name: str, memory_limit: int) -> Slot:
        raise NotImplementedError

    def _teardown(self) -> list[str]:
        return []

    def __enter__(self) -> MemoryCaps:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
