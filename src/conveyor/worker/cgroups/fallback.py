"""The RLIMIT_AS fallback where no memory cgroup is writable, and the warning that says,
once per process, why it is weaker.
"""

from __future__ import annotations

import logging
import resource
import threading

from conveyor.worker.cgroups.base import (
    CgroupError,
    MemoryCaps,
    Slot,
    SlotOutcome,
    _check_limit,
    read_text,
)

log = logging.getLogger("conveyor.worker.cgroups")

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
            pages = int(read_text(f"/proc/{pid or 'self'}/statm").split()[0])
            size = pages * resource.getpagesize()
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

    def usage(self) -> int | None:
        """The admitted runner's resident memory (the cap itself is on address space)."""
        if self._admitted is None:
            return None
        try:
            pages = int(read_text(f"/proc/{self._admitted}/statm").split()[1])
        except (OSError, ValueError, IndexError):   # it exited meanwhile
            return None
        return pages * resource.getpagesize()

    def kill_all(self) -> int:
        """Nothing to enumerate without a cgroup: kill the runner's process group instead."""
        return 0

    def remove(self) -> None:
        self._forget(self.name)



class _RlimitCaps(MemoryCaps):
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
