"""Conveyor: a message-broker distributed worker system.

A scheduler decides what runs and when, brokers carry work to named queues, workers run
each task in an isolated, memory-capped, non-dumpable process, and an autoscaler decides
how many workers exist.

The public API, everything a task module or a DAG file needs:

    from conveyor import DAG, Retry, Skip, task

Every worker process (supervisor, zygote, runners) imports this package first, so it only
names light modules: the scheduler's daemon, the brokers' client libraries, croniter and
kubernetes are imported by the commands that use them (`benchmarks/worker_footprint.py`
measures what this costs a worker). The DAG names (`DAG`, `TaskNode`, `Deadline`,
`DeadlineReference`, `TriggerRule`, `DagError`) are the scheduler's: they are imported on
first use (`__getattr__` below), since a worker process never builds a DAG, and so is the
scheduler's canvas starter, the first time a canvas is enqueued.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from conveyor.canvas import Handle, Signature, chain, chord, group, signature, use_starter
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.context import TaskContext, context
from conveyor.errors import (
    BrokerConnectionError,
    BrokerError,
    Cancelled,
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
from conveyor.tasks import (
    Defer,
    Retry,
    Skip,
    SoftTimeLimitExceeded,
    Task,
    TaskOptions,
    task,
    worker_process_init,
)

if TYPE_CHECKING:
    from conveyor.scheduler.alerts import Deadline, DeadlineReference
    from conveyor.scheduler.assets import Asset, Event
    from conveyor.scheduler.dag import DAG, TaskNode
    from conveyor.scheduler.errors import DagError
    from conveyor.scheduler.rules import TriggerRule

__version__ = "0.1.0"

#: The scheduler's names, and the module each is imported from on first use.
_SCHEDULER_NAMES = {
    "DAG": "conveyor.scheduler.dag",
    "Asset": "conveyor.scheduler.assets",
    "Event": "conveyor.scheduler.assets",
    "TaskNode": "conveyor.scheduler.dag",
    "Deadline": "conveyor.scheduler.alerts",
    "DeadlineReference": "conveyor.scheduler.alerts",
    "DagError": "conveyor.scheduler.errors",
    "TriggerRule": "conveyor.scheduler.rules",
}


def __getattr__(name: str) -> Any:
    """`conveyor.DAG` and the other scheduler names, imported the first time they are
    asked for (a worker never asks: its processes stay ~1 MiB smaller each)."""
    module = _SCHEDULER_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def _start_canvas(*args: Any, **kwargs: Any) -> Handle:
    """`.enqueue()` of a canvas: the scheduler's `start`, imported when first called
    (importing `conveyor.scheduler.canvas` makes it the starter from then on)."""
    from conveyor.scheduler.canvas import start
    return start(*args, **kwargs)


use_starter(_start_canvas)

__all__ = [
    "DAG",
    "Asset",
    "BrokerConnectionError",
    "BrokerError",
    "Cancelled",
    "Client",
    "ConfigError",
    "ConveyorError",
    "DagError",
    "DeadLettered",
    "Defer",
    "Deadline",
    "DeadlineReference",
    "Event",
    "Limit",
    "Message",
    "MessageError",
    "Rate",
    "ResultError",
    "ResultHandle",
    "ResultTimeout",
    "Retry",
    "Settings",
    "Signature",
    "Skip",
    "SoftTimeLimitExceeded",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskNode",
    "TaskOptions",
    "TriggerRule",
    "UnknownTask",
    "__version__",
    "chain",
    "chord",
    "context",
    "group",
    "signature",
    "task",
    "worker_process_init",
]
