"""Cgroup directories, v1 and v2 alike: where this process lives, the per-worker group,
stale groups of dead workers, and the slot and memory-caps logic both versions share.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conveyor.worker.cgroups.base import (
    CgroupError,
    MemoryCaps,
    Slot,
    SlotOutcome,
    _alive,
    _check_limit,
    _counter,
    _int_or_none,
    _kill_until_empty,
    _pids,
    _rmdir,
    _Unavailable,
    _write,
    read_text,
)

log = logging.getLogger("conveyor.worker.cgroups")

_GROUP = re.compile(r"conveyor-(\d+)(?:-\d+)?")


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
    for line in read_text("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        mine, theirs = left.split(), right.split()
        if len(mine) >= 5 and len(theirs) >= 3:
            mounts.append(_Mount(_unescape(mine[3]), Path(_unescape(mine[4])), theirs[0],
                                 frozenset(theirs[2].split(","))))
    return mounts


def _own_paths() -> dict[str, str]:
    """/proc/self/cgroup as {"": v2 path, "memory": v1 memory path, ...}."""
    paths: dict[str, str] = {}
    for line in read_text("/proc/self/cgroup").splitlines():
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



# -- what v1 and v2 slots and memory caps share --------------------------------------------------


class _CgroupSlot(Slot):
    """A task's own cgroup; subclasses say which files hold the cap and the counters."""

    #: the file holding the memory charged to the cgroup now
    usage_file = ""
    #: the 'key value' file holding the OOM-kill counter, and its key
    oom_file, oom_key = "", "oom_kill"

    def __init__(self, path: Path, name: str, memory_limit: int,
                 forget: Callable[[str], None], home: Path | None) -> None:
        super().__init__(name, memory_limit, forget)
        self.path = path
        self._procs = str(path / "cgroup.procs")  # precomputed: enter() is on the fork path
        self._oom = str(path / self.oom_file)  # precomputed: read after every task
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

    def oom_kills(self) -> int | None:
        if self._final is not None:
            return self._final.oom_kills
        try:
            return _counter(self._oom, self.oom_key)
        except OSError as exc:
            raise CgroupError(f"could not read the OOM counter of {self.path}: "
                              f"{exc.strerror}") from exc

    def usage(self) -> int | None:
        if self._removed or self.path is None:
            return None
        try:
            return _int_or_none(self.path / self.usage_file)
        except OSError:   # removed meanwhile: nothing is charged to it any more
            return None

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



class _CgroupCaps(MemoryCaps):
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
