"""The state store's rows as frozen dataclasses: what the repositories return.

Each record's fields are its table's columns in the table's order (`doc()` gives them back
as the row was, for JSON), and `from_row` builds it from a row of either database, parsing
a JSON column once where every reader of it wants data (a task instance's `spec`, a worker's
`runners`). A result or an attempt's log stays JSON text: most readers only pass it on, and
`readers/` turns it into data where it is shown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Self, TypeVar

Row = Mapping[str, Any]
R = TypeVar("R", bound="Record")

#: Heartbeat intervals without a beat before a worker is shown as stale.
STALE_AFTER = 3


_COLUMNS: dict[type, tuple[str, ...]] = {}


def _columns(cls: type) -> tuple[str, ...]:
    """The dataclass's field names, read once per class."""
    found = _COLUMNS.get(cls)
    if found is None:
        found = _COLUMNS[cls] = tuple(f.name for f in fields(cls))
    return found


def _values(cls: type, row: Row, **parsed: Any) -> dict[str, Any]:
    """The constructor arguments of `cls` from `row`, with `parsed` columns replaced."""
    values = {name: row[name] for name in _columns(cls)}
    values.update(parsed)
    return values


def _built(cls: type[R], values: dict[str, Any]) -> R:
    """A record of `cls` holding `values`, made without the dataclass's `__init__`: a frozen
    one sets each field through `object.__setattr__`, which made building a task instance
    (26 fields) cost as much as the query that read it, on the scheduler's event path.
    `values` has every field (`_values`), and no record has a `__post_init__`."""
    record = object.__new__(cls)
    record.__dict__.update(values)
    return record


class Record:
    """What every record offers: built from a row, and its columns as a JSON-ready dict, as
    the row was."""

    @classmethod
    def from_row(cls, row: Row) -> Self:
        """The record of `row`, its columns as stored (a record that parses a JSON column
        once for every reader says so in its own `from_row`)."""
        return _built(cls, _values(cls, row))

    def doc(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _columns(type(self))}


@dataclass(frozen=True)
class Dag(Record):
    """A DAG as the schedulers recorded it: version, schedule, next cron tick, pause, cap."""

    dag_id: str
    version: str
    file: str
    schedule: str | None
    timezone: str
    next_tick: float | None
    updated_at: float
    paused: int
    max_active_runs: int | None


@dataclass(frozen=True)
class Run(Record):
    """A DAG run. `conf` is its JSON text, as stored."""

    run_id: str
    dag_id: str
    logical_date: float
    state: str
    run_type: str
    conf: str
    dag_version: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    #: when the run was cancelled as a whole (`runs cancel`); None: it was not
    cancelled_at: float | None
    #: its DAG's callbacks and deadline (JSON text, see scheduler/alerts.py); None: none
    alerts: str | None
    #: when it must have ended by, and when the scheduler found it had not (None: not)
    deadline_at: float | None
    deadline_missed_at: float | None
    #: the code version of the worker its first task started on (None: none started yet,
    #: or workers that announce none)
    code_version: str | None


@dataclass(frozen=True)
class TaskInstance(Record):
    """One task of a run: its state, current attempt and budget, and its `spec` (what to
    run, limits, retry policy: a snapshot taken when the run was created), parsed once."""

    ti_id: str
    run_id: str
    task_id: str
    position: int
    state: str
    attempt: int
    max_attempts: int
    executor: str
    queue: str
    priority: int
    spec: Mapping[str, Any]
    queued_timeout: float
    heartbeat_timeout: float
    queued_at: float | None
    published_at: float | None
    started_at: float | None
    heartbeat_at: float | None
    ended_at: float | None
    next_retry_at: float | None
    deadline: float | None
    error: str | None
    hostname: str | None
    pid: int | None
    #: what the task returned (JSON text), once it succeeded
    result: str | None
    #: the attempt budget a clear restarts from (None: never cleared)
    tries: int | None
    #: the scheduler that claimed the current attempt for publishing
    claimed_by: str | None
    #: a mapped task's instance: its element's index, and the mapped task's id (else None)
    map_index: int | None
    map_task: str | None
    #: a mapped task: how many instances it was expanded into (None: not expanded)
    map_count: int | None
    #: 1 for a branch task (`dag.branch`): readiness counts branches among upstreams by it
    is_branch: int
    #: held unpublished until a worker of this code version is alive (its run is pinned
    #: to its code: scheduler/pinning.py); None: not held
    waiting_for: str | None
    #: what the trigger of a deferred attempt fired with (JSON text): the resumed segment's
    #: `context.trigger_event` (None: not resumed from a deferral)
    trigger_event: str | None

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return _built(cls, _values(cls, row, spec=json.loads(row["spec"])))


@dataclass(frozen=True)
class Attempt(Record):
    """One ended attempt of a task instance. `result` and `log` are JSON text."""

    ti_id: str
    attempt: int
    outcome: str
    queued_at: float | None
    started_at: float | None
    ended_at: float | None
    hostname: str | None
    pid: int | None
    error: str | None
    result: str | None
    log: str | None


@dataclass(frozen=True)
class Transition:
    """What a transition of a task instance is keyed by: which attempt of which task
    instance, when its event happened (`at`, the sender's clock) and when the scheduler
    applies it (`now`)."""

    ti_id: str
    attempt: int
    at: float
    now: float

    @property
    def params(self) -> dict[str, Any]:
        return {"ti_id": self.ti_id, "attempt": self.attempt, "at": self.at, "now": self.now}


@dataclass(frozen=True)
class Due(Record):
    """A queued or running task instance whose deadline passed (what `tick` looks at)."""

    ti_id: str
    run_id: str
    state: str
    attempt: int
    published_at: float | None


@dataclass(frozen=True)
class Finished(Record):
    """A run that just ended: how, and what its trace span needs."""

    state: str
    dag_id: str
    created_at: float


@dataclass(frozen=True)
class GridCell(Record):
    """One task instance of a DAG's grid of runs x tasks."""

    run_id: str
    task_id: str
    position: int
    state: str
    attempt: int
    logical_date: float
    run_state: str
    #: a mapped task: how many instances it has (None: not mapped, or not expanded yet)
    map_count: int | None


@dataclass(frozen=True)
class WorkerRecord(Record):
    """One worker's last heartbeat, as `conveyor status` shows it."""

    worker_id: str
    hostname: str
    pid: int
    queues: str
    concurrency: int
    busy: int
    interval: float
    started_at: float
    heartbeat_at: float
    #: {"limiter": kind, "slots": [{"slot", "task", "memory", "limit", ...}],
    #: "finished": {queue: [succeeded, failed] since it started}}, or None from a worker
    #: that reports no runners
    runners: dict[str, Any] | None = None
    #: the code version it announces (`--code-version`), None from an older worker
    code_version: str | None = None

    @classmethod
    def from_row(cls, row: Row) -> Self:
        runners = json.loads(row["runners"]) if row.get("runners") else None
        return _built(cls, _values(cls, row, runners=runners))

    @property
    def free(self) -> int:
        return max(0, self.concurrency - self.busy)

    def stale(self, now: float) -> bool:
        """Killed, frozen or cut off: no beat for over STALE_AFTER heartbeat intervals."""
        return now - self.heartbeat_at > STALE_AFTER * self.interval


@dataclass(frozen=True)
class SchedulerLease(Record):
    """A scheduler's lease: it holds until `lease_until` unless renewed."""

    scheduler_id: str
    hostname: str
    pid: int
    started_at: float
    lease_until: float


@dataclass(frozen=True)
class QueueSample(Record):
    """A queue's depth at the start of a sampling period, and the tasks finished in it
    (None: not known for that period)."""

    at: float
    queue: str
    ready: int
    in_flight: int
    delayed: int
    dead: int
    succeeded: int | None
    failed: int | None


@dataclass(frozen=True)
class Evaluation(Record):
    """What an autoscaler saw and chose for one target at an evaluation; None where it could
    not be read (the autoscaler's journal writes it, as a `Scaler` row)."""

    target: str
    kind: str
    queues: str
    replicas: int | None
    desired: int | None
    min_replicas: int
    max_replicas: int
    ready: int | None
    in_flight: int | None
    reason: str
    error: str | None
    polling_interval: float


@dataclass(frozen=True)
class Scaler(Evaluation):
    """An autoscaler target's last evaluation, and when it was made."""

    evaluated_at: float


@dataclass(frozen=True)
class Scaling(Record):
    """A replica change an autoscaler made, and why."""

    at: float
    target: str
    from_replicas: int
    to_replicas: int
    reason: str


@dataclass(frozen=True)
class CallbackRecord(Record):
    """A callback a transition fired (or a deadline a run missed): what to send, with its
    context (JSON text), and how far it got: pending (recorded, not yet published),
    published, succeeded or failed."""

    callback_id: str
    run_id: str
    ti_id: str
    attempt: int
    kind: str
    task: str
    executor: str
    queue: str
    context: str
    state: str
    claimed_by: str
    deadline: float | None
    created_at: float
    published_at: float | None
    ended_at: float | None
    error: str | None
