"""Which kind of memory caps this process may use: cgroup v2, then v1, then RLIMIT_AS.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conveyor.worker.cgroups.base import (
    CgroupError,
    MemoryCaps,
    _Unavailable,
)
from conveyor.worker.cgroups.fallback import _RlimitCaps, _warn_fallback
from conveyor.worker.cgroups.v1 import _Cgroup1Caps
from conveyor.worker.cgroups.v2 import _Cgroup2Caps

KINDS = ("cgroup2", "cgroup1", "rlimit")


def detect(parent: Path | None = None, *, force: str | None = None) -> MemoryCaps:
    """The best kind of memory caps this process may use: cgroup v2, then v1, then RLIMIT_AS.

    `parent`: a cgroup directory to create task groups under instead of this process's own
    cgroup (e.g. one an administrator delegated). `force`: "cgroup2" or "cgroup1" to fail
    with the reason instead of falling back, "rlimit" to use the fallback on purpose.
    Call before starting helper processes: on cgroup v2 the worker moves into a leaf.
    """
    if force is not None and force not in KINDS:
        raise CgroupError(f"unknown kind of memory caps {force!r}: use one of {', '.join(KINDS)}")
    openers: dict[str, Callable[[Path | None], MemoryCaps]] = {
        "cgroup2": _Cgroup2Caps.open, "cgroup1": _Cgroup1Caps.open}
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
    return _RlimitCaps(tuple(reasons))
