"""Executors: where a task instance's attempt runs. Several at once (Airflow AIP-61).

The scheduler is configured with a list of executor names, the first the default; a DAG or a
task may name another (`executor="local"`). Every executor takes a `Workload` (the message
that runs the attempt, and the task's `executor_config`) and makes sure the attempt's outcome
comes back as `conveyor.events.Event`s: the queue executor's workers publish them to the
scheduler's events queue; executors that watch the work themselves (local, kubernetes) hand
them to the `report` callback they are started with.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.events import Event
from conveyor.message import Message
from conveyor.scheduler.errors import ExecutorError

Report = Callable[[Event], None]


@dataclass(frozen=True)
class Workload:
    """One attempt of one task instance, ready to run."""

    message: Message
    config: Mapping[str, Any] = field(default_factory=dict)


class Executor(abc.ABC):
    """Starts attempts; outcomes come back as events, never as return values."""

    name = ""

    def start(self, report: Report) -> None:
        """Begin background work (watchers); events for attempts go to `report`."""
        self._report = report

    @abc.abstractmethod
    def submit(self, workload: Workload) -> None:
        """Start the attempt. ExecutorError if it can never run; other errors stop the
        scheduler (the attempt is republished after a restart)."""

    def submit_many(self, workloads: Sequence[Workload]
                    ) -> list[tuple[Workload, ExecutorError]]:
        """Start each attempt; return those refused, each with why. Executors that can send
        many at once (the queue executor: one publish batch) override this."""
        refused = []
        for workload in workloads:
            try:
                self.submit(workload)
            except ExecutorError as exc:
                refused.append((workload, exc))
        return refused

    def withdraw(self, ti: str, attempt: int) -> None:
        """Make sure attempt `attempt` of task instance `ti` never starts: the scheduler
        timed it out before it started. A message on a queue carries its own deadline to
        start (`Message.expires`), which workers keep, so most executors have nothing to do;
        one that starts attempts itself (kubernetes: a pod) takes it back."""
        return None

    def use_apps(self, apps: Sequence[str]) -> None:
        """The modules registering the tasks this executor runs changed (a DAG file was
        reloaded). Executors whose workers import them at start (local) restart them."""
        return None

    def check(self) -> None:
        """Raise if a background part died: the scheduler stops rather than limp along."""
        return None

    def close(self) -> None:
        """Stop background work and release connections."""
        return None


def event_for(message: Message, kind: str, **fields: Any) -> Event:
    """An outcome event about `message`, shaped as a worker would send it."""
    return Event(kind=kind, message_id=message.id, task=message.label,
                 attempt=message.attempt, run_id=message.run_id, trace_id=message.trace_id,
                 headers=dict(message.headers), **fields)
