"""The result record and the store interface every backend implements."""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from conveyor.errors import Cancelled, DeadLettered, MessageError, ResultError, TaskFailed
from conveyor.events import ENDED_WELL

#: Message header that asks the worker to keep the result; its value is ignored.
RESULT_HEADER = "result"
#: Final states a record can have; anything else is "not there (yet)".
STATUSES = ("succeeded", "failed", "dead_lettered", "expired", "cancelled", "skipped")


@dataclass(frozen=True)
class ResultRecord:
    """How one message ended for good: its value, or its failure."""

    status: str
    value: Any = None
    error: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""
    task: str = ""
    attempt: int = 0
    finished_at: float = field(default_factory=time.time)

    def encode(self) -> bytes:
        return json.dumps({"v": 1, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> ResultRecord:
        try:
            fields = json.loads(body)
            if fields.pop("v", None) != 1 or fields.get("status") not in STATUSES:
                raise ValueError(f"not a version-1 result: {str(fields)[:200]}")
            return cls(**fields)
        except (ValueError, TypeError, AttributeError) as exc:
            raise MessageError(f"malformed result record: {exc}") from None

    def unwrap(self, message_id: str) -> Any:
        """The value, or the failure raised as a `TaskFailed` (`DeadLettered`) people read.
        A task that raised `Skip` returned nothing: None (as Airflow's skipped task has no
        XCom); `status()` says "skipped"."""
        if self.status in ENDED_WELL:
            return self.value
        e = self.error
        what = ": ".join(p for p in (e.get("type", ""), e.get("message", "")) if p)
        detail = dict(error_type=e.get("type", ""), error_message=e.get("message", ""),
                      remote_traceback=e.get("traceback", ""), reason=self.reason)
        if self.status == "cancelled":
            raise Cancelled(f"task {self.task} ({message_id}) was cancelled: {self.reason}")
        if self.status == "expired":
            raise TaskFailed(f"task {self.task} ({message_id}) expired: {self.reason}", **detail)
        if self.status == "failed":
            text = f"task {self.task} ({message_id}) failed: {what or self.reason}"
            if e.get("traceback"):
                text += f"\nremote traceback:\n{e['traceback'].rstrip()}"
            raise TaskFailed(text, **detail)
        raise DeadLettered(f"task {self.task} ({message_id}) dead-lettered: {self.reason}"
                           + (f" (last error {what})" if what and what not in self.reason
                              else ""), **detail)


def encode_value(value: Any, max_bytes: int) -> None:
    """Check a task's return value fits the cap; a result is never truncated."""
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > max_bytes:
        raise ResultError(f"the task's result is {size} bytes, over the {max_bytes}-byte cap "
                          "(CONVEYOR_RESULT_MAX_BYTES): return a reference (a path or URL) "
                          "to large data instead")


class ResultStore(abc.ABC):
    """Where records live, keyed by message id; each expires `ttl` seconds after it is put."""

    @abc.abstractmethod
    def put(self, message_id: str, record: ResultRecord, ttl: float) -> bool:
        """Store `record` durably unless one is there already (first write wins: a
        redelivered message never replaces a value someone may have read). True if stored."""

    @abc.abstractmethod
    def get(self, message_id: str) -> ResultRecord | None:
        """The record, or None if there is none (not finished, never asked for, expired)."""

    @abc.abstractmethod
    def wait(self, message_id: str, timeout: float) -> ResultRecord | None:
        """Block until the record exists or `timeout` passes: woken by the store's own
        notification (pub/sub, LISTEN/NOTIFY, a wake socket), never by polling."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
