"""A task that attacks the worker it runs in, and reports what it could reach (imported with -A).

Given the supervisor's pid, it finds every other process of the worker through /proc (stat
stays world-readable) and, for each, tries what a hostile task would: read environ and mem,
PTRACE_ATTACH, list fd, read cwd, signal it, read its resource limits (prlimit: reading is
allowed exactly when writing is). It also tries to rewrite its own memory cgroup's cap.
Each attempt is reported as "ok" or the errno's name, grouped by the target's role.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

from conveyor.tasks import task

PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def _attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as exc:
        return _errno_name(exc.errno or 0)
    return "ok"


def _ptrace(pid: int) -> str:
    if _libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return _errno_name(ctypes.get_errno())
    os.waitpid(pid, WALL)  # the tracee stops; let it go again at once
    _libc.ptrace(PTRACE_DETACH, pid, None, None)
    return "ok"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(64)


def _probe(pid: int) -> dict[str, str]:
    return {
        "environ": _attempt(lambda: _read(f"/proc/{pid}/environ")),
        "mem": _attempt(lambda: open(f"/proc/{pid}/mem", "rb").close()),
        "ptrace": _ptrace(pid),
        "fd": _attempt(lambda: os.listdir(f"/proc/{pid}/fd")),
        "cwd": _attempt(lambda: os.readlink(f"/proc/{pid}/cwd")),
        "signal": _attempt(lambda: os.kill(pid, 0)),
        "prlimit": _attempt(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE)),
    }


def _parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _roles(supervisor: int) -> dict[int, str]:
    """Every process of the worker but this one: supervisor, zygote, lanes, runners."""
    parents = _parents()
    roles, level = {supervisor: "supervisor"}, {supervisor}
    for role in ("zygote", "lane", "runner"):
        level = {pid for pid, parent in parents.items() if parent in level}
        roles.update(dict.fromkeys(level, role))
    roles.pop(os.getpid(), None)
    return roles


def _own_cgroup_cap() -> str:
    """Try to write this task's own memory cap back to the same value (v1 or v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for base, name in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
                           ("/sys/fs/cgroup", "memory.max")):
            cap = Path(base + path) / name
            wanted = "memory" in controllers.split(",") or controllers == ""
            if wanted and path != "/" and cap.is_file():
                return _attempt(functools.partial(_rewrite, cap))
    return "none"


def _own_rlimit_cap() -> str:
    """Try to raise this task's own RLIMIT_AS hard limit (the fallback's cap), if it has one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY:
        return "none"
    try:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard * 2))
    except ValueError:  # Python's word for EPERM here
        return "EPERM"
    return "ok"


def _rewrite(path: Path) -> None:
    path.write_text(path.read_text())


@task(name="iso.probe")
def probe(supervisor: int, sibling_marker: str = "") -> dict[str, object]:
    deadline = time.monotonic() + 20
    while sibling_marker and not Path(sibling_marker).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # The lanes fork their warm (idle) runners in the background: on a loaded machine the
    # probe can start before any exists, and then reports only the running sibling.
    while _runners(supervisor) < (2 if sibling_marker else 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    results: dict[str, dict[str, list[str]]] = {}
    for pid, role in sorted(_roles(supervisor).items()):
        for check, outcome in _probe(pid).items():
            seen = results.setdefault(role, {}).setdefault(check, [])
            if outcome not in seen:
                seen.append(outcome)
    if sibling_marker:
        Path(sibling_marker + ".done").write_text("")  # the sibling may go now
    return {"uid": os.getuid(), "roles": results, "cgroup_cap": _own_cgroup_cap(),
            "rlimit_cap": _own_rlimit_cap()}


def _runners(supervisor: int) -> int:
    """Runners of the worker other than this one (the sleeping sibling, idle ones)."""
    return sum(role == "runner" for role in _roles(supervisor).values())


@task(name="iso.sleep")
def sleep(seconds: float, marker: str) -> None:
    """A running sibling for the probe: stays until the probe is done (or `seconds` pass)."""
    Path(marker + ".partial").write_text(str(os.getpid()))
    os.replace(marker + ".partial", marker)    # whole, never read half written
    deadline = time.monotonic() + seconds
    while not Path(marker + ".done").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
