"""Keeping a task's result: the supervisor's one step between deciding and settling.

Only messages that ask (the `result` header) are touched, so fire-and-forget work pays one
dict lookup. The record is written BEFORE the message is acked or dead-lettered: a worker
killed in between leaves the message to be delivered again, and the store's first-write-wins
`put` means a caller who already read a value never sees it change. The store is opened on
first use, so a worker whose messages never ask never connects to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from conveyor.errors import ConveyorError, ResultError
from conveyor.message import Message
from conveyor.results.base import RESULT_HEADER, ResultRecord, ResultStore, encode_value
from conveyor.worker.outcome import Action, Outcome

log = logging.getLogger("conveyor.worker")


def wanted(message: Message) -> bool:
    """Whether the message asked for its result (DAG tasks keep theirs in the run)."""
    headers = message.headers
    return RESULT_HEADER in headers and headers.get("settle") != "report"


class ResultKeeper:
    """Checks results against the size cap and stores final outcomes before settlement."""

    def __init__(self, open_store: Callable[[], ResultStore], ttl: float,
                 max_bytes: int) -> None:
        self._open = open_store
        self._store: ResultStore | None = None
        self.ttl = ttl
        self.max_bytes = max_bytes

    def check(self, outcome: Outcome) -> Outcome:
        """A success whose value is over the cap becomes a failure saying so."""
        if outcome.kind != "succeeded":
            return outcome
        try:
            encode_value(outcome.result, self.max_bytes)
        except ResultError as exc:
            return Outcome("failed", reason=str(exc),
                           error={"type": "ResultTooLarge", "message": str(exc)})
        return outcome

    def keep(self, message: Message, outcome: Outcome, action: Action) -> Action:
        """Store the outcome if it is final; if the store fails, requeue instead of acking."""
        record = final_record(message, outcome, action)
        if record is None:
            return action
        try:
            self.put(message, record)
        except ConveyorError as exc:
            log.error("could not store the result of %s %s (%s): requeueing it", message.label,
                      message.id, exc)
            return Action("requeue", reason=f"result not stored: {exc}")
        return action

    def unrun(self, message: Message, status: str, reason: str) -> None:
        """Record a message that ends without running: quarantined ("dead_lettered":
        unknown task, crash loop), past its deadline to start ("expired") or cancelled."""
        try:
            self.put(message, ResultRecord(status, reason=reason, task=message.label,
                                           attempt=message.attempt))
        except ConveyorError as exc:
            log.error("could not store that %s %s %s: %s", message.label, message.id, status,
                      exc)

    def put(self, message: Message, record: ResultRecord) -> None:
        if self._store is None:
            self._store = self._open()
        self._store.put(message.id, record, self.ttl)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def final_record(message: Message, outcome: Outcome, action: Action) -> ResultRecord | None:
    """The record of a message that ends here: acked after success, or dead-lettered."""
    task, attempt = message.label, message.attempt
    if action.verb == "ack" and outcome.kind == "succeeded":
        return ResultRecord("succeeded", value=outcome.result, task=task, attempt=attempt)
    if action.verb == "ack" and outcome.kind == "skipped":
        return ResultRecord("skipped", reason=outcome.reason, task=task, attempt=attempt)
    if action.verb == "ack" and outcome.kind == "cancelled":
        return ResultRecord("cancelled", reason=outcome.reason, task=task, attempt=attempt)
    if action.verb != "dead_letter":
        return None
    status = "failed" if outcome.error else "dead_lettered"
    return ResultRecord(status, error=dict(outcome.error), reason=action.reason, task=task,
                        attempt=attempt)
