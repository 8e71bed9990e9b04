"""Helpers for tests and benchmarks of the scheduler: an executor that only records.

`RecordingExecutor` stands in for a real one when a test drives the engine with a fake
clock: it keeps each workload it is given, and `events(...)` builds the events a worker
would send back for one of them.
"""

from __future__ import annotations

from typing import Any

from conveyor.events import Event
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Workload, event_for


class RecordingExecutor(Executor):
    """Records workloads; refuses those whose task is listed in `refuse`."""

    def __init__(self, name: str = "queue", refuse: tuple[str, ...] = ()) -> None:
        self.name = name
        self.refuse = refuse
        self.sent: list[Workload] = []

    def submit(self, workload: Workload) -> None:
        if workload.message.headers.get("task_id") in self.refuse:
            raise ExecutorError(f"refused {workload.message.headers['task_id']}")
        self.sent.append(workload)

    def pop(self, task_id: str) -> Workload:
        """The oldest recorded workload of `task_id`, removed."""
        for i, work in enumerate(self.sent):
            if work.message.headers["task_id"] == task_id:
                return self.sent.pop(i)
        raise AssertionError(f"{task_id} was not dispatched; sent: {self.task_ids()}")

    def task_ids(self) -> list[str]:
        return [w.message.headers["task_id"] for w in self.sent]


def event(work: Workload, kind: str, at: float, **fields: Any) -> Event:
    """The event a worker would send about `work` at time `at`."""
    return event_for(work.message, kind, at=at, **fields)
