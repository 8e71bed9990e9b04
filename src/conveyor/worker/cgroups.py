"""Memory caps for task runners: one cgroup per task (v2 or v1), or an RLIMIT_AS fallback.

Why a cgroup per task: the kernel's OOM killer then acts inside that cgroup only, so a task
that blows its cap dies alone while the worker and every other task keep running (scenario
1), and the cgroup's own `oom_kill` counter says so: the supervisor never has to guess from a
SIGKILL, which may have come from a time limit, an operator or the host.

Layout. cgroup v2 forbids a cgroup that holds processes from handing controllers to its
children ("no internal processes"), so the worker moves itself into a leaf of its own group:

    cgroup v2   <own>/conveyor-<pid>/supervisor    the worker (start helpers such as the zygote
                                                   after `detect()`, so they land here too)
                <own>/conveyor-<pid>/task-<name>   memory.max, memory.swap.max=0, oom.group=1
    cgroup v1   <own>/conveyor-<pid>/task-<name>   memory.limit_in_bytes, then memsw

Lifecycle (supervisor unless noted):

    limiter = detect()                  # once, at start
    slot = limiter.prepare(name, cap)   # per task; name unique per task, cap 0 = no cap
    slot.enter()                        # in a freshly forked child, before user code, or
    slot.admit(runner_pid)              # from the supervisor, for a runner forked ahead
    slot.outcome()                      # after the runner exited or reported
    slot.remove()                       # an admitted runner still alive goes back home;
                                        # anything else left in the cgroup is SIGKILLed
    limiter.close()                     # at exit: kills leftovers, removes conveyor-<pid>

Cost. enter()/admit() is one write to cgroup.procs, but the kernel then takes its global
cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period unless another
move happened moments before: ~0.1 ms back-to-back, 5-15 ms after an idle pause (measured
on Linux 6.18, v1 and v2 alike; benchmarks/fork_cost.py). To keep that off a task's start,
prepare and admit a slot while its runner is forked ahead and call `slot.set_limit(cap)`
(a plain file write) when the task arrives.

Without a writable memory cgroup the limiter falls back to RLIMIT_AS and says once, at
WARNING, why that is weaker.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from conveyor.errors import ConveyorError

log = logging.getLogger("conveyor.worker.cgroups")

KINDS = ("cgroup2", "cgroup1", "rlimit")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_GROUP = re.compile(r"conveyor-(\d+)(?:-\d+)?")
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


def _read(path: Path | str) -> str:
    with open(path) as f:
        return f.read()


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
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def _int_or_none(path: Path) -> int | None:
    try:
        return int(_read(path))
    except (FileNotFoundError, ValueError):
        return None


def _pids(cgroup: Path) -> list[int]:
    """Processes in the cgroup (zombies are not listed: they no longer count)."""
    try:
        return [int(pid) for pid in _read(cgroup / "cgroup.procs").split()]
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
    """rmdir, retrying while the kernel still releases processes that just exited (EBUSY)."""
    deadline, delay = time.monotonic() + timeout, 0.001
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise CgroupError(f"could not remove {path}: {exc.strerror}; still inside: "
                                  f"{_pids(path) or 'no process'}") from exc
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


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


# -- where this process lives -----------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    root: str  # the cgroup path that is mounted at `point`
    point: Path
    fstype: str
    options: frozenset[str]


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[_Mount]:
    mounts = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        mine, theirs = left.split(), right.split()
        if len(mine) >= 5 and len(theirs) >= 3:
            mounts.append(_Mount(_unescape(mine[3]), Path(_unescape(mine[4])), theirs[0],
                                 frozenset(theirs[2].split(","))))
    return mounts


def _own_paths() -> dict[str, str]:
    """/proc/self/cgroup as {"": v2 path, "memory": v1 memory path, ...}."""
    paths: dict[str, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _locate(mount: _Mount, path: str) -> Path | None:
    """The directory of cgroup `path` under `mount`, or None if that mount does not show it."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return mount.point / path[len(root):].lstrip("/")


def _own_dir(fstype: str, controller: str) -> Path:
    """This process's cgroup directory in the hierarchy of `controller` ("" = cgroup v2)."""
    path = _own_paths().get(controller)
    label = controller or "cgroup2"
    if path is None:
        raise _Unavailable(f"/proc/self/cgroup has no {label} line")
    for mount in _mounts():
        if mount.fstype == fstype and (not controller or controller in mount.options):
            found = _locate(mount, path)
            if found is not None and found.is_dir():
                return found
    raise _Unavailable(f"no {fstype} mount shows this process's {label} cgroup {path}")


def _make_group(base: Path) -> Path:
    """Create conveyor-<pid> (conveyor-<pid>-<n> if this process already holds one)."""
    pid = os.getpid()
    for n in range(100):
        path = base / (f"conveyor-{pid}-{n}" if n else f"conveyor-{pid}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise _Unavailable(f"cannot create {path}: {exc.strerror} (euid {os.geteuid()}); "
                               f"run the worker as root or delegate {base} to its user") from None
    raise _Unavailable(f"{base} already holds 100 conveyor-{pid}* groups")


def _sweep_stale(base: Path) -> None:
    """Remove empty groups left by workers that died without close() (SIGKILL, host OOM).

    Only groups named after a pid that no longer exists, and only empty directories: rmdir
    refuses a cgroup that still holds processes, so nothing running is ever touched.
    """
    for entry in base.iterdir():
        match = _GROUP.fullmatch(entry.name)
        if match is None or not entry.is_dir() or _alive(int(match.group(1))):
            continue
        for child in (c for c in entry.iterdir() if c.is_dir()):
            _try_rmdir(child)
        if _try_rmdir(entry):
            log.info("removed %s, left behind by a worker that no longer runs", entry)


def _try_rmdir(path: Path) -> bool:
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


# -- the fallback warning ---------------------------------------------------------------------

_warned = False
_warned_lock = threading.Lock()


def _warn_fallback(reasons: list[str]) -> None:
    """Say once per process, plainly, what the rlimit fallback does not protect against."""
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warned = True
    log.warning(
        "task memory caps fall back to RLIMIT_AS (%s), which is weaker. It caps each "
        "task's virtual address space, not its resident memory, so mapped files and thread "
        "arenas count and real memory use does not; a task over the cap gets MemoryError/ENOMEM "
        "from its own allocation instead of an OOM kill, and the kernel records nothing. For "
        "real caps run the worker as root on a host with the memory cgroup controller (v1, or "
        "v2 with memory enabled), or give it a delegated cgroup v2 subtree with the memory "
        "controller (systemd: Delegate=yes; containers: a writable cgroup namespace).",
        "; ".join(reasons))


def reset_fallback_warning() -> None:
    """Let the next fallback warn again (for tests, or after an operator fixed the host)."""
    global _warned
    with _warned_lock:
        _warned = False


# -- slots --------------------------------------------------------------------------------------


class Slot:
    """One task's memory cap: prepared in the supervisor, entered by (or for) the runner.

    Slots are never reused: a retry or redelivery gets a new slot under a new name.
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


class _CgroupSlot(Slot):
    """A task's own cgroup; subclasses say which files hold the cap and the counters."""

    def __init__(self, path: Path, name: str, memory_limit: int,
                 forget: Callable[[str], None], home: Path | None) -> None:
        super().__init__(name, memory_limit, forget)
        self.path = path
        self._procs = str(path / "cgroup.procs")  # precomputed: enter() is on the fork path
        self._home = home
        self._admitted: int | None = None
        self._final: SlotOutcome | None = None
        self._removed = False

    def configure(self) -> None:
        raise NotImplementedError

    def _apply_limit(self, path: Path, memory_limit: int) -> None:
        raise NotImplementedError

    def set_limit(self, memory_limit: int) -> None:
        _check_limit(self.name, memory_limit)
        assert self.path is not None
        self._apply_limit(self.path, memory_limit)
        self.memory_limit = memory_limit

    def _read_outcome(self, path: Path) -> SlotOutcome:
        raise NotImplementedError

    def enter(self) -> None:
        """One open+write+close of "0" to cgroup.procs: moves the caller, costs microseconds.

        Call before dropping privileges (cgroup.procs belongs to the worker's user). If it
        fails the task must not run uncapped: let the error end the runner.
        """
        try:
            _write(self._procs, "0")
        except OSError as exc:
            raise CgroupError(f"process {os.getpid()} could not enter {self.path}: "
                              f"{exc.strerror}; not running the task without its cap") from exc

    def admit(self, pid: int) -> None:
        """Move a runner forked ahead of need into this cgroup before it gets its task."""
        try:
            _write(self._procs, str(pid))
        except ProcessLookupError:
            raise CgroupError(f"runner {pid} exited before it could be moved into "
                              f"{self.path}") from None
        except OSError as exc:
            raise CgroupError(f"could not move runner {pid} into {self.path}: "
                              f"{exc.strerror}") from exc
        self._admitted = pid

    def outcome(self) -> SlotOutcome:
        if self._final is not None:
            return self._final
        assert self.path is not None
        try:
            return self._read_outcome(self.path)
        except OSError as exc:
            raise CgroupError(f"could not read the memory counters of {self.path}: "
                              f"{exc.strerror}") from exc

    def kill_all(self) -> int:
        assert self.path is not None
        return _kill_until_empty(self.path)

    def remove(self) -> None:
        """Snapshot the outcome, send an admitted runner home, SIGKILL the rest, rmdir.

        Call after the task ended. A runner that was admitted and still lives (it may run
        another task) goes back to the worker's cgroup; anything else still here is what
        the task left behind (forked children) and is killed.
        """
        if self._removed or self.path is None:
            return
        if self._final is None:
            try:
                self._final = self.outcome()
            except CgroupError as exc:  # removing matters more than the snapshot
                log.warning("%s; removing it anyway", exc)
        self._send_runner_home()
        if _pids(self.path):
            self.kill_all()
        _rmdir(self.path)
        self._removed = True
        self._forget(self.name)

    def _send_runner_home(self) -> None:
        pid, home = self._admitted, self._home
        if pid is None or home is None or self.path is None or pid not in _pids(self.path):
            return
        try:
            _write(home / "cgroup.procs", str(pid))
        except OSError as exc:
            log.warning("could not return runner %d from %s to %s (%s); killing it instead",
                        pid, self.path, home, exc.strerror)

    def destroy(self) -> None:
        self._admitted = None
        self.remove()


class _Cgroup2Slot(_CgroupSlot):
    kind = "cgroup2"

    def configure(self) -> None:
        """memory.max, then no swap (a cap that swaps is no cap), then group OOM kills."""
        assert self.path is not None
        if self.memory_limit:
            self._apply_limit(self.path, self.memory_limit)
        if (self.path / "memory.oom.group").exists():
            _set(self.path / "memory.oom.group", "1")  # a task's children die with it

    def _apply_limit(self, path: Path, memory_limit: int) -> None:
        _set(path / "memory.max", str(memory_limit) if memory_limit else "max")
        if (path / "memory.swap.max").exists():
            _set(path / "memory.swap.max", "0" if memory_limit else "max")

    def _read_outcome(self, path: Path) -> SlotOutcome:
        kills = _keyed(path / "memory.events").get("oom_kill")
        return SlotOutcome(bool(kills), _int_or_none(path / "memory.peak"), kills)

    def kill_all(self) -> int:
        """cgroup.kill (Linux 5.14+) kills the whole cgroup atomically; else signal in rounds."""
        assert self.path is not None
        kill = self.path / "cgroup.kill"
        if not kill.exists():
            return _kill_until_empty(self.path)
        count = len(_pids(self.path))
        _set(kill, "1")
        return max(count, _kill_until_empty(self.path))


class _Cgroup1Slot(_CgroupSlot):
    kind = "cgroup1"

    def configure(self) -> None:
        """OOM killer on (v1 children inherit oom_kill_disable), memory cap, then memsw.

        memsw (memory+swap) must never be below the memory limit, so it is written second.
        Without swap accounting (no memsw file) swappiness 0 keeps the task from swapping.
        """
        assert self.path is not None
        _set(self.path / "memory.oom_control", "0")
        if self.memory_limit:
            self._apply_limit(self.path, self.memory_limit)

    def _apply_limit(self, path: Path, memory_limit: int) -> None:
        """memsw >= memory at every instant: lower memory first, raise memsw first."""
        value = str(memory_limit) if memory_limit else "-1"
        memory, memsw = path / "memory.limit_in_bytes", path / "memory.memsw.limit_in_bytes"
        if not memsw.exists():
            _set(memory, value)
            _swappiness_zero(path)
            return
        lowering = (memory_limit or 2**63) <= int(_read(memory))
        for file in (memory, memsw) if lowering else (memsw, memory):
            _set(file, value)

    def _read_outcome(self, path: Path) -> SlotOutcome:
        kills = _keyed(path / "memory.oom_control").get("oom_kill")
        return SlotOutcome(bool(kills), _int_or_none(path / "memory.max_usage_in_bytes"), kills)


def _swappiness_zero(path: Path) -> None:
    try:
        _write(path / "memory.swappiness", "0")
    except OSError as exc:
        log.debug("could not set swappiness 0 in %s: %s", path, exc.strerror)


def _check_limit(name: str, memory_limit: int) -> None:
    if memory_limit < 0:
        raise CgroupError(f"memory limit {memory_limit} for {name!r} is negative: give bytes, "
                          f"or 0 for no cap")


class _RlimitSlot(Slot):
    """RLIMIT_AS: the address space at entry plus `memory_limit`; see `_warn_fallback`.

    The cap is relative because a runner inherits the worker's whole address space (often
    hundreds of MiB of mappings it never touches); an absolute cap below that would fail
    every allocation. The hard limit is lowered too, so the task cannot raise it again.
    """

    kind = "rlimit"
    _admitted: int | None = None

    def enter(self) -> None:
        self._cap(None)

    def admit(self, pid: int) -> None:
        self._cap(pid)
        self._admitted = pid

    def set_limit(self, memory_limit: int) -> None:
        """Applies to an admitted runner at once; a lowered hard limit cannot be raised."""
        _check_limit(self.name, memory_limit)
        self.memory_limit = memory_limit
        if self._admitted is not None:
            self._cap(self._admitted)

    def _cap(self, pid: int | None) -> None:
        if not self.memory_limit:
            return
        try:
            size = int(_read(f"/proc/{pid or 'self'}/statm").split()[0]) * resource.getpagesize()
            _, hard = resource.prlimit(pid or 0, resource.RLIMIT_AS)
            cap = size + self.memory_limit
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)  # a hard limit only goes down without CAP_SYS_RESOURCE
            resource.prlimit(pid or 0, resource.RLIMIT_AS, (cap, cap))
        except (OSError, ValueError) as exc:
            who = f"process {pid}" if pid else "this process"
            raise CgroupError(f"could not set RLIMIT_AS for {who}: {exc}; not running the task "
                              f"without its cap") from exc

    def outcome(self) -> SlotOutcome:
        return SlotOutcome(False, None, None)

    def kill_all(self) -> int:
        """Nothing to enumerate without a cgroup: kill the runner's process group instead."""
        return 0

    def remove(self) -> None:
        self._forget(self.name)


# -- limiters -------------------------------------------------------------------------------------


class Limiter:
    """Where a worker's task runners get their memory caps; one per worker process."""

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
        """A fresh slot for one task. `name` must be unique per task; 0 bytes = no cap."""
        if not _NAME.fullmatch(name):
            raise CgroupError(f"slot name {name!r} is not allowed: use 1-128 letters, digits, "
                              f"'_', '.', ':' or '-', starting with a letter or digit")
        _check_limit(name, memory_limit)
        with self._lock:
            if self._closed:
                raise CgroupError(f"cannot prepare {name!r}: this limiter was closed")
            if name in self._slots:
                raise CgroupError(f"slot {name!r} is still open: names must be unique per task "
                                  f"(e.g. message id, attempt and delivery)")
            slot = self._new_slot(name, memory_limit)
            self._slots[name] = slot
        return slot

    def close(self) -> None:
        """Kill what still runs in open slots and remove every directory this limiter made.

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

    def __enter__(self) -> Limiter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class _CgroupLimiter(Limiter):
    """Task cgroups under one group per worker: `<base>/conveyor-<pid>/task-<name>`."""

    slot_class: type[_CgroupSlot] = _CgroupSlot

    def __init__(self, base: Path, group: Path, home: Path | None) -> None:
        super().__init__()
        self.base, self.group, self.home = base, group, home

    def _new_slot(self, name: str, memory_limit: int) -> Slot:
        path = self.group / f"task-{name}"
        try:
            os.mkdir(path)
        except FileExistsError:
            raise CgroupError(f"{path} exists already: slot names must be unique per task") \
                from None
        except OSError as exc:
            raise CgroupError(f"could not create {path}: {exc.strerror}") from exc
        slot = self.slot_class(path, name, memory_limit, self._forget, self.home)
        try:
            slot.configure()
        except BaseException:
            _try_rmdir(path)
            raise
        return slot

    def _teardown(self) -> list[str]:
        try:
            _rmdir(self.group)
        except CgroupError as exc:
            return [str(exc)]
        return []


class _Cgroup1Limiter(_CgroupLimiter):
    kind = "cgroup1"
    slot_class = _Cgroup1Slot

    def describe(self) -> str:
        swap = "memory+swap" if (self.base / "memory.memsw.limit_in_bytes").exists() \
            else "memory only (no swap accounting; swappiness 0)"
        return f"cgroup1: a memory cgroup per task under {self.group} ({swap})"

    @classmethod
    def open(cls, parent: Path | None) -> _Cgroup1Limiter:
        """Use `parent` (a v1 memory cgroup directory) or this process's own memory cgroup."""
        own: Path | None
        try:
            own = _own_dir("cgroup", "memory")
        except _Unavailable:
            if parent is None:
                raise
            own = None
        base = parent or own
        assert base is not None
        if not (base / "memory.limit_in_bytes").exists():
            raise _Unavailable(f"{base} is not a cgroup v1 memory directory")
        if not os.access(base, os.W_OK):
            raise _Unavailable(f"{base} is not writable for euid {os.geteuid()}")
        if parent is None:
            _sweep_stale(base)
        return cls(base, _make_group(base), own)


class _Cgroup2Limiter(_CgroupLimiter):
    """cgroup v2: also moves the worker out of `base` so `base` may enable memory below it."""

    kind = "cgroup2"
    slot_class = _Cgroup2Slot

    def __init__(self, base: Path, group: Path, home: Path | None,
                 controller: str = "memory") -> None:
        super().__init__(base, group, home)
        self.controller = controller
        self.moved_from: Path | None = None  # where the worker lived before its leaf
        self.enabled_on_base = False

    def describe(self) -> str:
        moved = f"; worker moved to {self.home}" if self.moved_from else ""
        return f"cgroup2: a memory cgroup per task under {self.group} (memory.max, no swap, " \
               f"oom.group){moved}"

    @classmethod
    def open(cls, parent: Path | None, controller: str = "memory") -> _Cgroup2Limiter:
        """Use `parent` or this process's own v2 cgroup; see the module docstring for layout."""
        own: Path | None
        try:
            own = _own_dir("cgroup2", "")
        except _Unavailable:
            if parent is None:
                raise
            own = None
        base = parent or own
        assert base is not None
        _check_v2_base(base, controller)
        if parent is None:
            _sweep_stale(base)
        limiter = cls(base, _make_group(base), own, controller)
        try:
            limiter._delegate(move_self=own is not None and own.samefile(base))
        except (OSError, _Unavailable) as exc:
            problems = limiter._teardown()
            reason = exc if isinstance(exc, _Unavailable) else f"{exc.filename}: {exc.strerror}"
            raise _Unavailable(f"{reason}" + (f" (cleanup: {'; '.join(problems)})"
                                                if problems else "")) from None
        return limiter

    def _delegate(self, move_self: bool) -> None:
        """Leaf for the worker if it lives in `base`, then enable the controller below."""
        if move_self:
            leaf = self.group / "supervisor"
            os.mkdir(leaf)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            self.moved_from, self.home = self.base, leaf
        if self.controller not in _read(self.base / "cgroup.subtree_control").split():
            try:
                _write(self.base / "cgroup.subtree_control", f"+{self.controller}")
            except OSError as exc:
                raise _Unavailable(self._enable_failed(exc)) from None
            self.enabled_on_base = True
        _write(self.group / "cgroup.subtree_control", f"+{self.controller}")

    def _enable_failed(self, exc: OSError) -> str:
        if exc.errno != errno.EBUSY:
            return f"could not enable {self.controller} in {self.base}: {exc.strerror}"
        return (f"{self.base} still holds other processes {_pids(self.base)}, and a v2 cgroup "
                f"may hold processes or give controllers to children, not both: run the worker "
                f"alone in its delegated cgroup (systemd Delegate=yes; a container whose "
                f"entrypoint execs the worker), or pass a parent cgroup that holds no processes")

    def _teardown(self) -> list[str]:
        """Undo `_delegate` in reverse: controllers off, processes back, directories gone."""
        problems = []
        for path in (self.group, self.base if self.enabled_on_base else None):
            if path is not None and path.exists():
                try:
                    _write(path / "cgroup.subtree_control", f"-{self.controller}")
                except OSError as exc:
                    problems.append(f"could not disable {self.controller} in {path}: "
                                    f"{exc.strerror}")
        if self.moved_from is not None and self.home is not None:
            problems += _move_all(self.home, self.moved_from)
            problems += _rmdir_or_problem(self.home)
        return problems + _rmdir_or_problem(self.group)


def _check_v2_base(base: Path, controller: str) -> None:
    """Raise _Unavailable unless `base` is a writable v2 cgroup offering `controller`."""
    controllers_file = base / "cgroup.controllers"
    if not controllers_file.exists():
        raise _Unavailable(f"{base} is not a cgroup v2 directory")
    offered = _read(controllers_file).split()
    if controller not in offered:
        raise _Unavailable(f"{controllers_file} offers {' '.join(offered) or 'no controllers'}, "
                           f"not {controller}: enable it in the parent's cgroup.subtree_control "
                           f"or delegate a subtree that has it")
    if not os.access(base, os.W_OK) or not os.access(base / "cgroup.subtree_control", os.W_OK):
        raise _Unavailable(f"{base} is not writable for euid {os.geteuid()}")


def _move_all(source: Path, target: Path) -> list[str]:
    """Move every process in `source` (the worker, helpers it started) back to `target`."""
    problems = []
    for pid in _pids(source):
        try:
            _write(target / "cgroup.procs", str(pid))
        except ProcessLookupError:
            continue
        except OSError as exc:
            problems.append(f"could not move process {pid} back to {target}: {exc.strerror}")
    return problems


def _rmdir_or_problem(path: Path) -> list[str]:
    try:
        _rmdir(path)
    except CgroupError as exc:
        return [str(exc)]
    return []


class _RlimitLimiter(Limiter):
    kind = "rlimit"

    def __init__(self, reasons: tuple[str, ...]) -> None:
        super().__init__()
        self.reasons = reasons

    def describe(self) -> str:
        return ("rlimit: RLIMIT_AS per task (virtual address space, not resident memory; an "
                "over-cap task gets MemoryError, not an OOM kill) because " +
                "; ".join(self.reasons))

    def _new_slot(self, name: str, memory_limit: int) -> Slot:
        return _RlimitSlot(name, memory_limit, self._forget)


# -- detection ------------------------------------------------------------------------------------


def detect(parent: Path | None = None, *, force: str | None = None) -> Limiter:
    """The best memory limiter this process may use: cgroup v2, then v1, then RLIMIT_AS.

    `parent`: a cgroup directory to create task groups under instead of this process's own
    cgroup (e.g. one an administrator delegated). `force`: "cgroup2" or "cgroup1" to fail
    with the reason instead of falling back, "rlimit" to use the fallback on purpose.
    Call before starting helper processes: on cgroup v2 the worker moves into a leaf.
    """
    if force is not None and force not in KINDS:
        raise CgroupError(f"unknown memory limiter {force!r}: use one of {', '.join(KINDS)}")
    openers: dict[str, Callable[[Path | None], Limiter]] = {
        "cgroup2": _Cgroup2Limiter.open, "cgroup1": _Cgroup1Limiter.open}
    reasons = []
    for kind, opener in openers.items():
        if force not in (None, kind):
            continue
        try:
            return opener(Path(parent) if parent is not None else None)
        except (_Unavailable, OSError) as exc:
            if force == kind:
                raise CgroupError(f"{kind} memory caps were required but cannot be used: "
                                  f"{exc}") from None
            reasons.append(f"{kind}: {exc}")
    if force == "rlimit":
        reasons.append("rlimit was asked for explicitly")
    _warn_fallback(reasons)
    return _RlimitLimiter(tuple(reasons))


__all__ = ["KINDS", "CgroupError", "Limiter", "Slot", "SlotOutcome", "detect",
           "reset_fallback_warning"]
