"""Retry timing: exponential backoff with jitter and a cap.

The worker (task retries) and the scheduler (task-instance retries) both ask this one
function, so a task retried by either follows the same policy. It is three lines of
arithmetic, so it is written out rather than borrowed from a retry library's internals.
"""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base: float = 1.0, cap: float = 300.0,
                  jitter: bool = True) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry).

    base * 2**(attempt-1), plus up to `base` seconds of random jitter, never above `cap`.
    """
    delay = base * 2 ** min(max(1, attempt) - 1, 64)
    if jitter:
        delay += random.uniform(0.0, base)
    return float(min(cap, delay))
