"""cgroup v2 memory caps: memory.max, no swap, oom.group; the worker moves into a leaf of
its own group so that group may hand the memory controller to its task cgroups.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from conveyor.worker.cgroups.base import (
    CgroupError,
    SlotOutcome,
    _int_or_none,
    _keyed,
    _kill_until_empty,
    _pids,
    _rmdir,
    _set,
    _Unavailable,
    _write,
    read_text,
)
from conveyor.worker.cgroups.hierarchy import (
    _CgroupCaps,
    _CgroupSlot,
    _make_group,
    _own_dir,
    _sweep_stale,
)


class _Cgroup2Slot(_CgroupSlot):
    kind = "cgroup2"
    usage_file = "memory.current"
    oom_file = "memory.events"

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



class _Cgroup2Caps(_CgroupCaps):
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
    def open(cls, parent: Path | None, controller: str = "memory") -> _Cgroup2Caps:
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
        caps = cls(base, _make_group(base), own, controller)
        try:
            caps._delegate(move_self=own is not None and own.samefile(base))
        except (OSError, _Unavailable) as exc:
            problems = caps._teardown()
            reason = exc if isinstance(exc, _Unavailable) else f"{exc.filename}: {exc.strerror}"
            raise _Unavailable(f"{reason}" + (f" (cleanup: {'; '.join(problems)})"
                                                if problems else "")) from None
        return caps

    def _delegate(self, move_self: bool) -> None:
        """Leaf for the worker if it lives in `base`, then enable the controller below."""
        if move_self:
            leaf = self.group / "supervisor"
            os.mkdir(leaf)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            self.moved_from, self.home = self.base, leaf
        if self.controller not in read_text(self.base / "cgroup.subtree_control").split():
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
    offered = read_text(controllers_file).split()
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
