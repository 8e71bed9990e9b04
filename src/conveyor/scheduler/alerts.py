"""What a DAG asks to be told about: callbacks on transitions, and deadlines on its runs.

    from datetime import timedelta
    from conveyor.scheduler import DAG, Deadline, DeadlineReference

    dag = DAG("revenue", on_failure=page_oncall,                # the run failed
              deadline=Deadline(reference=DeadlineReference.LOGICAL_DATE,
                                interval=timedelta(hours=2), callback=page_oncall))
    dag.task(load, retries=3, on_retry=note_retry, on_failure=page_oncall)

A callback is a registered task (the `@task` object, or its name): the scheduler records it in
the state store with the transition that fires it and sends it like any task, with one
argument, the context (a dict: dag id, run id, task id, attempt, the error...). This module
only declares (workers import DAG files too); `callbacks.py` fires them and `deadlines.py`
finds the deadlines due.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conveyor.errors import ConfigError
from conveyor.tasks import Task

#: The transitions a callback may be attached to, on a task or on a DAG.
KINDS = ("on_success", "on_failure", "on_retry", "on_cancel")
#: The kind recorded for a deadline's callback.
DEADLINE = "deadline"
_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?$")


def callback_spec(value: Task[Any, Any] | str, what: str) -> dict[str, str]:
    """How a callback is kept in a run's snapshot: its task name, and its queue when the
    task object names one other than "default" ("": the task's queue, or "default" for a
    DAG's). ConfigError, naming `what`, for anything that is not a task."""
    if isinstance(value, Task):
        queue = value.options.queue
        return {"task": value.name, "queue": "" if queue == "default" else queue}
    if isinstance(value, str) and value:
        return {"task": value, "queue": ""}
    raise ConfigError(f"{what} must be a registered task (a function decorated with "
                      f"@conveyor.task, or its name), not {value!r}")


def callback_specs(given: dict[str, Any], what: str) -> dict[str, dict[str, str]]:
    """The callbacks among `given` (on_success=..., ...), as specs; None values dropped."""
    return {kind: callback_spec(given[kind], f"{what} {kind}")
            for kind in KINDS if given.get(kind) is not None}


@dataclass(frozen=True)
class Reference:
    """Where a deadline's interval starts: `logical_date`, `queued_at`, or `time_of_day`
    (the first `at`, in `timezone`, at or after the run's logical date)."""

    kind: str
    at: str = ""
    timezone: str = "UTC"

    def start(self, *, logical_date: float, queued_at: float) -> float:
        """The reference's moment for a run, in Unix seconds."""
        if self.kind == "logical_date":
            return logical_date
        if self.kind == "queued_at":
            return queued_at
        return next_time_of_day(self.at, self.timezone, logical_date)

    def doc(self) -> dict[str, str]:
        return {"kind": self.kind, "at": self.at, "timezone": self.timezone}


class DeadlineReference:
    """The references a `Deadline` counts from (Airflow 3.1's names are aliases)."""

    LOGICAL_DATE = Reference("logical_date")
    QUEUED_AT = Reference("queued_at")
    DAGRUN_LOGICAL_DATE = LOGICAL_DATE
    DAGRUN_QUEUED_AT = QUEUED_AT

    @staticmethod
    def time_of_day(at: str, timezone: str = "UTC") -> Reference:
        """A fixed time of day ("06:00" or "06:00:30") in `timezone`: the first one at or
        after the run's logical date."""
        if not isinstance(at, str) or not _TIME.match(at):
            raise ConfigError(f"time of day {at!r} must be HH:MM or HH:MM:SS, e.g. '06:00'")
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # not in every worker process

        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"timezone {timezone!r} is not an IANA zone name "
                              "(e.g. 'UTC', 'Europe/Paris')") from None
        return Reference("time_of_day", at, timezone)


def next_time_of_day(at: str, timezone: str, after: float) -> float:
    """The first `at` (HH:MM[:SS]) in `timezone` at or after `after` (Unix seconds)."""
    match = _TIME.match(at)
    assert match is not None
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    from zoneinfo import ZoneInfo  # here: `import conveyor` (every worker process) stays light

    zone = ZoneInfo(timezone)
    day = datetime.fromtimestamp(after, zone).date()
    for offset in (0, 1, 2):   # 2: a day whose time of day falls in a DST gap
        moment = datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=zone)
        moment += timedelta(days=offset)
        if moment.timestamp() >= after:
            return moment.timestamp()
    raise AssertionError("unreachable: a time of day recurs within two days")


@dataclass(frozen=True)
class Deadline:
    """A run must have ended by `reference` + `interval` (a timedelta or seconds), or
    `callback` (a registered task) is sent once and the run is marked as having missed it."""

    reference: Reference
    interval: timedelta | float
    callback: Task[Any, Any] | str | None = None

    def seconds(self) -> float:
        value = self.interval
        return value.total_seconds() if isinstance(value, timedelta) else float(value)

    def spec(self) -> dict[str, Any]:
        """As a run keeps it (JSON): the reference, the interval, the callback (or None)."""
        if not isinstance(self.reference, Reference):
            raise ConfigError(f"Deadline reference must be one of DeadlineReference's "
                              f"(LOGICAL_DATE, QUEUED_AT, time_of_day(...)), not "
                              f"{self.reference!r}")
        if isinstance(self.interval, bool) or not isinstance(
                self.interval, (timedelta, int, float)) or self.seconds() < 0:
            raise ConfigError(f"Deadline interval must be a timedelta or seconds >= 0, not "
                              f"{self.interval!r}")
        callback = (None if self.callback is None
                    else callback_spec(self.callback, "Deadline callback"))
        return {"reference": self.reference.doc(), "interval": self.seconds(),
                "callback": callback}


def deadline_at(spec: dict[str, Any], *, logical_date: float, queued_at: float) -> float:
    """When a run with this deadline spec (`Deadline.spec()`) must have ended."""
    ref = spec["reference"]
    reference = Reference(ref["kind"], ref.get("at", ""), ref.get("timezone", "UTC"))
    return reference.start(logical_date=logical_date, queued_at=queued_at) + float(
        spec["interval"])
