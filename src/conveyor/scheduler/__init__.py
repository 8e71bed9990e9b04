"""The scheduler: DAGs with durable state, idempotent transitions, retries, timeouts, cron,
and an executor per task (queue, local, kubernetes).

It decides what runs and when, and is the only writer of run and task-instance state. Every
transition is one conditional UPDATE in the state store, so a duplicate or late event, a
second scheduler, or a restart after `kill -9` never makes a second transition.
"""

from conveyor.scheduler.alerts import Deadline, DeadlineReference
from conveyor.scheduler.assets import Asset, Event
from conveyor.scheduler.dag import DAG, Options, TaskNode
from conveyor.scheduler.errors import DagError, ExecutorError, RunError

__all__ = ["DAG", "Asset", "DagError", "Deadline", "DeadlineReference", "Event",
           "ExecutorError", "Options", "RunError", "TaskNode"]
