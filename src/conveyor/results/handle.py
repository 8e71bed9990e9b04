"""`ResultHandle`: what `enqueue` returns, the message that was sent and the way to its result.

It carries the message (`handle.message`, and `id`, `queue`, `task`, `label` directly, so
code that used the returned message's id keeps working) and asks the result store only when
`result()` or `status()` is called: enqueueing never opens a result store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.errors import ResultError, ResultTimeout
from conveyor.message import Message
from conveyor.results.base import RESULT_HEADER, ResultRecord, ResultStore

if TYPE_CHECKING:
    from conveyor.control import CancelResult

#: The longest single wait on the store when the caller waits forever.
WAIT_SLICE = 60.0


class ResultHandle:
    """A published message and its future result; see `result` and `status`."""

    def __init__(self, message: Message, store: Callable[[], ResultStore],
                 canceller: Callable[[str], CancelResult] | None = None, *,
                 duplicate: bool = False) -> None:
        """`canceller`: the client's `cancel` (a handle made without one cannot cancel)."""
        self.message = message
        self._store = store
        self._canceller = canceller
        #: True when nothing was published: another message held the enqueue's unique key,
        #: and this handle is that message's (`id` is its id; `message` is otherwise the one
        #: that was not sent)
        self.duplicate = duplicate

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def task(self) -> str:
        return self.message.task

    @property
    def label(self) -> str:
        return self.message.label

    @property
    def keeps_result(self) -> bool:
        """Whether the message asked the worker to store its result."""
        return RESULT_HEADER in self.message.headers

    def cancel(self) -> CancelResult:
        """Cancel this message (`Client.cancel`): it never starts, or its worker stops it."""
        if self._canceller is None:
            raise ResultError(f"this handle of {self.label} ({self.id}) has no client to "
                              "cancel through: use Client(...).cancel(handle.id)")
        return self._canceller(self.id)

    def status(self) -> str:
        """'succeeded', 'failed', 'dead_lettered', 'expired' (not started by its deadline),
        'cancelled', 'skipped' (it raised `Skip`: its result is None), or 'pending' (queued
        or running, or its result's time to live ran out), without waiting."""
        record = self._store().get(self.id) if self.keeps_result else None
        return "pending" if record is None else record.status

    def result(self, timeout: float | None = 10.0) -> Any:
        """The task's return value, waiting up to `timeout` seconds (None: forever).

        None for a task that raised `Skip` (`status()` says "skipped"). Raises `TaskFailed`
        with the remote error when the task failed for good (or expired before it started),
        `DeadLettered` when the message was quarantined, `ResultTimeout` when it is still
        queued or running at the timeout.
        """
        self._check_asked()
        record = self._wait(math.inf if timeout is None else timeout)
        if record is None:
            raise ResultTimeout(
                f"task {self.label} ({self.id}) has no result after {timeout:g} s: it is "
                f"still queued or running (is a worker consuming queue {self.queue!r}?)")
        return record.unwrap(self.id)

    def _wait(self, timeout: float) -> ResultRecord | None:
        store = self._store()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            found = store.wait(self.id, max(0.0, min(remaining, WAIT_SLICE)))
            if found is not None or remaining <= WAIT_SLICE:
                return found

    def _check_asked(self) -> None:
        if not self.keeps_result:
            raise ResultError(
                f"message {self.id} ({self.label}) did not ask for its result to be kept: "
                "enqueue it with task.enqueue() (without store_result=False) or "
                "Client.enqueue(message, keep_result=True)")

    def __repr__(self) -> str:
        return f"<ResultHandle {self.label} {self.id} on {self.queue!r}>"
