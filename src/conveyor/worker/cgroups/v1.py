"""cgroup v1 memory caps: memory.limit_in_bytes, then memory+swap (memsw).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from conveyor.worker.cgroups.base import (
    SlotOutcome,
    _int_or_none,
    _keyed,
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

log = logging.getLogger("conveyor.worker.cgroups")

class _Cgroup1Slot(_CgroupSlot):
    kind = "cgroup1"
    usage_file = "memory.usage_in_bytes"
    oom_file = "memory.oom_control"

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
        lowering = (memory_limit or 2**63) <= int(read_text(memory))
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



class _Cgroup1Caps(_CgroupCaps):
    kind = "cgroup1"
    slot_class = _Cgroup1Slot

    def describe(self) -> str:
        swap = "memory+swap" if (self.base / "memory.memsw.limit_in_bytes").exists() \
            else "memory only (no swap accounting; swappiness 0)"
        return f"cgroup1: a memory cgroup per task under {self.group} ({swap})"

    @classmethod
    def open(cls, parent: Path | None) -> _Cgroup1Caps:
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
