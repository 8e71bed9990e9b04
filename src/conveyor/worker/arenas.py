"""One malloc arena for the supervisor: its threads' arenas were most of its idle growth.

glibc gives a thread that allocates while another holds the main arena an arena of its own
(up to 8 per core), and what is freed in one arena is never reused by another. The
supervisor's threads (signals, heartbeat, cancel watch, lane readers, metrics) each
allocate a little, at start-up and briefly after: with one arena an idle 2-slot worker's
supervisor holds ~1.8 MiB less anonymous memory (Pss_Anon 16.2 against 18.0 MiB,
`benchmarks/worker_footprint.py`). The GIL already serialises most of their allocations,
so nothing waits on the one arena's lock. Only the supervisor: the zygote is a new program
(exec), so its lanes and the tasks keep the C library's default.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: mallopt's parameter for the most arenas a process may have (glibc's malloc.h).
M_ARENA_MAX = -8


def use_one_arena(libc: Any = None) -> bool:
    """Limit this process to one malloc arena; call it before any thread starts. False
    where the C library has no `mallopt` (musl) or refuses: nothing changes then."""
    libc = ctypes.CDLL(None) if libc is None else libc
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, 1))
