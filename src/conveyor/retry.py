"""Retry timing of tasks: exponential backoff with jitter and a cap, by tenacity's wait strategy.

The worker (task retries) and the scheduler (task-instance retries) both ask this one
function, so a task retried by either follows the same policy. A task's retry is not a loop
in this process (its next attempt is a message published with a delay, or a task instance
due later), so no `Retrying` runs it: the delay of retry number `attempt` is what
`wait_exponential_jitter` says for a `RetryCallState` at that attempt.
"""

from __future__ import annotations

from tenacity import RetryCallState, Retrying, wait_exponential_jitter


def backoff_delay(attempt: int, base: float = 1.0, cap: float = 300.0,
                  jitter: bool = True) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry).

    base * 2**(attempt-1), plus up to `base` seconds of random jitter, never above `cap`.
    """
    wait = wait_exponential_jitter(multiplier=base, max=cap, jitter=base if jitter else 0.0)
    state = RetryCallState(retry_object=Retrying(wait=wait), fn=None, args=(), kwargs={})
    state.attempt_number = max(1, attempt)
    return float(wait(state))
