"""What happened to a task run, and what to do with its message: two pure functions.

`classify` turns the facts the supervisor gathered (the runner's own report, its exit
status, the cgroup's OOM counter, which time limit fired) into exactly one `Outcome`.
`decide` turns an outcome plus the message's budgets into one broker `Action`. Both are pure
so every rule is table-tested without forking anything.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from conveyor.events import ENDED_WELL
from conveyor.retry import backoff_delay

Kind = Literal["succeeded", "failed", "oom_killed", "timed_out", "killed", "lost",
               "interrupted", "retry_requested", "cancelled", "skipped", "deferred"]
#: Outcomes that spend the task's retry budget (a fault of the task itself).
FAULTS = frozenset({"failed", "oom_killed", "timed_out", "killed", "lost", "retry_requested"})


@dataclass(frozen=True)
class Facts:
    """Everything the supervisor knows once a runner has exited."""

    report: Mapping[str, Any] | None  # the runner's last frame, None if it sent none
    exit_status: int | None  # os.waitpid status, None if unknown (runner vanished)
    oom_killed: bool = False
    hard_timed_out: bool = False
    interrupted: bool = False  # the worker killed it while shutting down
    last_words: str = ""  # the runner's last line of output: why it died unreported
    cancelled: bool = False  # its cancel (`Client.cancel`) reached it while it ran
    fenced: bool = False  # interrupted as its lease could not be renewed (worker/fencing.py)


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    result: Any = None
    error: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    retry_delay: float | None = None  # a task's own Retry(delay=...)
    asset_extra: Mapping[str, Any] = field(default_factory=dict)  # context.set_asset_extra


def classify(facts: Facts) -> Outcome:
    """Exactly one outcome; the cgroup's OOM counter beats any guess from a signal."""
    report = facts.report or {}
    if facts.cancelled:  # whatever it did once told (stopped, killed, or even finished)
        return Outcome("cancelled", reason="cancelled while running")
    if facts.interrupted and facts.fenced:
        return Outcome("interrupted", reason="self-fenced: its lease could not be renewed "
                                             "(the broker was unreachable)")
    if facts.interrupted:
        return Outcome("interrupted", reason="the worker stopped before the task finished")
    if facts.oom_killed:
        return Outcome("oom_killed", reason="killed by the kernel: over its memory cap")
    if facts.hard_timed_out:
        return Outcome("timed_out", reason="hard time limit passed: killed")
    kind = report.get("outcome")
    if kind == "succeeded" and _exited_cleanly(facts.exit_status):
        return Outcome("succeeded", result=report.get("result"),
                       asset_extra=report.get("asset_extra") or {})
    if kind == "skipped":   # it raised Skip, or its command exited with a skip code
        return Outcome("skipped", reason=report.get("reason", ""))
    if kind == "deferred" and _exited_cleanly(facts.exit_status):   # it raised Defer
        return Outcome("deferred", result=report.get("deferral"), reason=report.get("reason", ""))
    if kind in ("failed", "timed_out", "retry_requested"):
        return Outcome(kind, error=report.get("error", {}), reason=report.get("reason", ""),
                       retry_delay=report.get("retry_delay"))
    return _from_exit_status(facts.exit_status, facts.last_words)


def outside_dag(outcome: Outcome) -> Outcome:
    """A deferral of a task enqueued on its own (no scheduler to resume it): a failure
    that says so."""
    why = ("Defer is for DAG tasks: a task enqueued on its own has no scheduler to resume "
           "it when its trigger fires; wait in the task, raise Retry(delay=...), or run it "
           "in a DAG")
    return Outcome("failed", reason=why, error={"type": "DeferError", "message": why})


def _exited_cleanly(status: int | None) -> bool:
    return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _from_exit_status(status: int | None, last_words: str = "") -> Outcome:
    """An outcome from how the runner ended, quoting its last line of output if it had one."""
    why = f"; its last output: {last_words}" if last_words else ""
    if status is None:
        return Outcome("lost", reason=f"the runner vanished without an exit status{why}")
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Outcome("killed", reason=f"runner killed by {name} before reporting{why}")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    return Outcome("failed", reason=f"runner exited with code {code} before reporting{why}",
                   error={"type": "RunnerExit", "message": f"exit code {code}{why}"})


@dataclass(frozen=True)
class Budget:
    """How many tries a message gets, by kind of failure."""

    max_retries: int = 3  # task faults (including OOM kills) before dead-lettering
    max_deliveries: int = 20  # interruptions and lost workers, counted by the broker
    backoff: float = 1.0
    backoff_max: float = 300.0


@dataclass(frozen=True)
class Action:
    verb: Literal["ack", "retry", "requeue", "dead_letter"]
    delay: float = 0.0
    reason: str = ""


def decide(outcome: Outcome, attempt: int, budget: Budget, report_only: bool = False) -> Action:
    """Ack success; retry faults with backoff until the budget is spent, then dead-letter.

    Interruptions are requeued without spending the retry budget (the broker's delivery
    count bounds them). With `report_only` (the scheduler owns retries) a final failure is
    acked after it is reported, never retried or dead-lettered here.
    """
    if outcome.kind in ENDED_WELL or outcome.kind == "cancelled":  # never retried
        return Action("ack", reason=outcome.reason)
    if outcome.kind == "deferred":   # its scheduler runs it again when its trigger fires
        return Action("ack", reason=outcome.reason)
    if outcome.kind == "interrupted":
        return Action("requeue", reason=outcome.reason)
    reason = f"{outcome.kind}: {outcome.reason or outcome.error.get('message', '')}".rstrip(": ")
    if report_only:
        return Action("ack", reason=reason)
    if attempt > budget.max_retries:
        return Action("dead_letter", reason=f"{reason} (attempt {attempt} of "
                                            f"{budget.max_retries + 1}, budget spent)")
    delay = outcome.retry_delay
    if delay is None:
        delay = backoff_delay(attempt, budget.backoff, budget.backoff_max)
    return Action("retry", delay=delay, reason=reason)


def over_delivery_cap(delivery_count: int, budget: Budget) -> Action | None:
    """A message delivered more often than the cap (crash loops) goes to the dead letters."""
    if delivery_count > budget.max_deliveries:
        return Action("dead_letter", reason=f"delivered {delivery_count} times without an "
                      f"outcome (cap {budget.max_deliveries}): workers keep dying on it")
    return None


def exec_report(status: int, skip_codes: Collection[int] = ()) -> dict[str, Any]:
    """How an exec'd command ended, as a runner report: an exit code in `skip_codes`
    (`dag.command(..., skip_on_exit_code=99)`, Airflow's BashOperator) means skipped."""
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return {"outcome": "succeeded", "result": {"exit_code": 0}}
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code in skip_codes:
            return {"outcome": "skipped",
                    "reason": f"command exited with code {code} (skip_on_exit_code)"}
        return {"outcome": "failed", "reason": f"command exited with code {code}",
                "error": {"type": "CommandFailed", "message": f"exit code {code}"}}
    return {}
