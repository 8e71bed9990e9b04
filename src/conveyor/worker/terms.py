"""The terms a message runs under in this worker: its retry budget, its memory cap and
time limits (the message's own, else its task's, else the worker's flags), whether it may
run here at all, and the frame its runner gets. Pure functions of the message, the task
registry and the worker's config, so the supervisor's loop holds none of these rules.
"""

from __future__ import annotations

from typing import Any

from conveyor.broker import Delivery
from conveyor.message import Message
from conveyor.tasks import REGISTRY
from conveyor.worker.config import WorkerConfig
from conveyor.worker.outcome import Budget, over_delivery_cap


def budget_of(message: Message, c: WorkerConfig) -> Budget:
    """Retries and their backoff: the message's retry count, else its task's, else ours."""
    task = REGISTRY.get(message.task)
    retries = message.max_retries if message.max_retries >= 0 else (
        task.options.max_retries if task else c.max_retries)
    backoff = task.options.retry_backoff if task else c.retry_backoff
    cap = task.options.retry_backoff_max if task else c.retry_backoff_max
    return Budget(retries, c.max_deliveries, backoff, cap)


def limits_for(m: Message, c: WorkerConfig) -> tuple[int, float, float]:
    """Memory cap, hard and soft time limits: the message's, else the task's, else ours."""
    task = REGISTRY.get(m.task)
    o = task.options if task else None
    return (m.memory_limit or (o.memory_limit if o else 0) or c.memory_limit,
            m.time_limit or (o.time_limit if o else 0) or c.time_limit,
            m.soft_time_limit or (o.soft_time_limit if o else 0) or c.soft_time_limit)


def unrunnable(delivery: Delivery, message: Message, budget: Budget) -> str | None:
    """Why a readable delivery is dead-lettered before it runs (its delivery cap is
    spent, or no --app registers its task); None if it may run."""
    capped = over_delivery_cap(delivery.delivery_count, budget)
    if capped is not None:
        return capped.reason
    if message.task and message.task not in REGISTRY:
        return (f"unknown task {message.task!r}: no module given with --app, nor a DAG "
                "file of --dags-folder, registers it: add the module that defines it to "
                "--app, or give the worker the DAGs folder whose file defines it")
    return None


def wire_of(message: Message) -> dict[str, Any]:
    """The task frame a runner gets (worker/runner.py reads it)."""
    return {"task": message.task, "command": list(message.command),
            "args": list(message.args), "kwargs": dict(message.kwargs), "id": message.id,
            "queue": message.queue, "attempt": message.attempt,
            "headers": dict(message.headers)}
