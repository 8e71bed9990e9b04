"""Retry timing: exponential backoff with jitter and a cap, from tenacity's wait strategies.

The worker (task retries) and the scheduler (task-instance retries) both ask this one
function, so a task retried by either follows the same policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tenacity import wait_exponential, wait_random
from tenacity.wait import wait_base


@dataclass(frozen=True)
class _Attempt:
    """The one field of tenacity's RetryCallState its wait strategies read."""

    attempt_number: int


def backoff_delay(attempt: int, base: float = 1.0, cap: float = 300.0,
                  jitter: bool = True) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry).

    base * 2**(attempt-1), plus up to `base` seconds of random jitter, never above `cap`.
    """
    strategy: wait_base = wait_exponential(multiplier=base, max=cap)
    if jitter:  # wait_exponential_jitter's `initial` is deprecated, `multiplier` is new in 9
        strategy = strategy + wait_random(0, base)
    return float(min(cap, strategy(_Attempt(max(1, attempt)))))  # type: ignore[arg-type]
