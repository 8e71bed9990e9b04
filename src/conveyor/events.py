"""Outcome events a worker sends to a message's `reply_to` queue.

The scheduler (or `conveyor enqueue --wait`) consumes them. Each names the message id, the
attempt and the delivery it came from, so a late event from a stale attempt can be told apart
and ignored: a transition keyed on (id, attempt) happens once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from conveyor.errors import MessageError

KINDS = ("started", "heartbeat", "succeeded", "failed", "retried", "oom_killed", "timed_out",
         "interrupted", "dead_lettered",
         # flow control: parked in its key's waiting area (a pool's, for a DAG task), and
         # handed a slot and published again; the scheduler's queued_timeout waits meanwhile
         "parked", "unparked",
         # settled unrun (dead-lettered; a DAG attempt acked): not started by its deadline
         "expired",
         # acked on a cancel (`Client.cancel`): before it started, or stopped while running
         "cancelled",
         # the task raised Skip (or its command exited with a skip code): acked, not retried
         "skipped",
         # the task raised Defer: acked; `result` is its trigger, which the scheduler records
         "deferred")
#: Kinds after which the attempt is over (the message was settled one way or another).
FINAL = frozenset({"succeeded", "dead_lettered", "expired", "cancelled", "skipped"})
#: Kinds of a task that ended well: it ran to its end, or skipped itself. Neither is a
#: fault: never retried, a None result for a skip, counted with the successes.
ENDED_WELL = frozenset({"succeeded", "skipped"})


@dataclass(frozen=True)
class Event:
    kind: str
    message_id: str
    task: str
    attempt: int
    delivery: int = 0
    at: float = field(default_factory=time.time)
    run_id: str = ""
    trace_id: str = ""
    hostname: str = ""
    pid: int = 0
    result: Any = None
    error: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    retry_in: float = 0.0
    #: When the attempt started (wall clock), on outcome events: an outcome applied before
    #: its `started` event (another scheduler held that one) still records the start.
    started_at: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The attempt's last lines of output (stdout and stderr), on outcome events.
    log: Sequence[str] = ()
    #: The code version of the worker (`--code-version`), on `started` events: a run
    #: records the one its first task started on (README "Runs pinned to their code").
    code_version: str = ""
    #: On `succeeded`: the extras a task set for its outlets' asset events through its
    #: context (`context.set_asset_extra`), by URI (README "Runs started by assets").
    asset_extra: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({"v": 1, **asdict(self)}, separators=(",", ":"),
                          default=repr).encode()

    @classmethod
    def decode(cls, body: bytes) -> Event:
        try:
            fields = json.loads(body)
            if fields.pop("v", None) != 1 or fields.get("kind") not in KINDS:
                raise ValueError(f"not a version-1 event: {str(fields)[:200]}")
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in fields.items() if k in known})
        except (ValueError, TypeError, AttributeError) as exc:
            raise MessageError(f"malformed event: {exc}") from None
