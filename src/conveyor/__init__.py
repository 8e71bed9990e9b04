"""Conveyor: a message-broker distributed worker system.

A scheduler decides what runs and when, brokers carry work to named queues, workers run
each task in an isolated, memory-capped, non-dumpable process, and an autoscaler decides
how many workers exist.

The public API, everything a task module or a DAG file needs:

    from conveyor import DAG, Retry, task

Every worker process (supervisor, zygote, runners) imports this package first, so it only
names light modules: the scheduler's daemon, the brokers' client libraries, croniter and
kubernetes are imported by the commands that use them (`benchmarks/worker_footprint.py`
measures what this costs a worker).
"""

from conveyor.client import Client
from conveyor.config import Settings
from conveyor.context import TaskContext, context
from conveyor.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigError,
    ConveyorError,
    DeadLettered,
    MessageError,
    ResultError,
    ResultTimeout,
    TaskFailed,
    UnknownTask,
)
from conveyor.flow import Limit, Rate
from conveyor.message import Message
from conveyor.results.handle import ResultHandle
from conveyor.scheduler.dag import DAG, TaskNode
from conveyor.scheduler.errors import DagError
from conveyor.tasks import (
    Retry,
    SoftTimeLimitExceeded,
    Task,
    TaskOptions,
    task,
    worker_process_init,
)

__version__ = "0.1.0"

__all__ = [
    "DAG",
    "BrokerConnectionError",
    "BrokerError",
    "Client",
    "ConfigError",
    "ConveyorError",
    "DagError",
    "DeadLettered",
    "Limit",
    "Message",
    "MessageError",
    "Rate",
    "ResultError",
    "ResultHandle",
    "ResultTimeout",
    "Retry",
    "Settings",
    "SoftTimeLimitExceeded",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskNode",
    "TaskOptions",
    "UnknownTask",
    "__version__",
    "context",
    "task",
    "worker_process_init",
]
