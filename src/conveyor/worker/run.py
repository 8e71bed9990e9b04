"""One delivery a worker holds, from acceptance to settlement: the supervisor's record."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from conveyor.broker import Delivery
from conveyor.flow import Spec
from conveyor.message import Message
from conveyor.worker.clock import Timer
from conveyor.worker.outcome import Budget
from conveyor.worker.pool import Lane, Runner, Task


@dataclass(eq=False)
class Run:
    """One delivery this worker holds, from acceptance to settlement."""

    delivery: Delivery
    message: Message
    budget: Budget
    accepted: float = field(default_factory=time.monotonic)
    started: float = 0.0
    soft_at: float = math.inf
    hard_at: float = math.inf
    hard_timed_out: bool = False
    interrupted: bool = False
    fenced: bool = False  # stopped as its lease could not be renewed (worker/fencing.py)
    cancelled: bool = False  # its cancel reached it while it ran (Supervisor._stop_cancelled)
    runner: Runner | None = None
    limits: list[Spec] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)  # its limits on the worker's clock
    trace: Any = None  # its spans (a tracing.otel.Claim) while tracing is on

    @property
    def log_label(self) -> str:
        return self.message.log_words


def slots(usage: list[tuple[Lane, Task | None, int | None]], now: float) -> list[dict[str, Any]]:
    """What each runner slot holds (`Pool.usage`), for the worker's heartbeat: its task
    (the name only; a command's program only: its arguments may hold secrets), for how
    long, and the memory charged to its lane now against the task's cap (0: no cap)."""
    found = []
    for lane, run, used in usage:
        slot: dict[str, Any] = {"slot": lane.index, "memory": used, "task": None}
        if isinstance(run, Run):
            m = run.message
            slot.update(task=m.task or os.path.basename(m.command[0] if m.command else ""),
                        id=m.id, queue=m.queue, seconds=round(now - run.started, 1),
                        limit=lane.slot.memory_limit)
        found.append(slot)
    return found
