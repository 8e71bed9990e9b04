"""Applying the trigger rules (and branches) to a run: which pending tasks start, which never will.

The caller holds the run's lock (every transaction of the engine, `operations.py` and
`cancel.py` takes it first), so the states read here do not change underneath. Each
decision is written with an UPDATE guarded by `state = 'pending'`: applying the same
decisions twice (a second scheduler, a restart after a crash) changes nothing the second
time, and a task is queued once. Decisions that end a task (skipped, upstream_failed) are
followed down: their children are judged next, until nothing more is decided.

What a pending task becomes is `rules.py`'s decision from the counts of its upstreams'
states (counted by the query: a join below 1,000 tasks is one row), except below a branch:
a task that a branch upstream which succeeded did not follow is skipped, whatever its rule
(Airflow's `NotPreviouslySkippedDep`: clearing such a task skips it again).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.scheduler.branches import follows
from conveyor.scheduler.rules import ALL_SUCCESS, READY, SKIP, UPSTREAM_FAILED, Tally, judge_tally
from conveyor.state.records import TaskInstance
from conveyor.state.tasks import TaskInstances

#: The state each ending decision writes.
ENDING = {SKIP: "skipped", UPSTREAM_FAILED: "upstream_failed"}


@dataclass
class Pending:
    """A pending task and the counts of its direct upstreams' states (one row of
    `pending_children` / `pending_of_run`)."""

    ti_id: str
    task_id: str
    rule: str
    upstream: Tally
    #: upstreams that succeeded and are branches (their choice is read only then)
    branches: int = 0
    #: a branch upstream that succeeded did not follow this task
    unfollowed: bool = False

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Pending:
        up = Tally(total=int(row["total"]), success=int(row["success"] or 0),
                   skipped=int(row["skipped"] or 0), failed=int(row["failed"] or 0),
                   upstream_failed=int(row["upstream_failed"] or 0))
        return cls(row["ti_id"], row["task_id"], row["trigger_rule"] or ALL_SUCCESS, up,
                   int(row["branches"] or 0))


def unfollowed(branch_rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The task ids (of `branch_parents` rows) that a branch upstream did not follow. A
    branch with no recorded return value (marked success by hand without having run) has
    chosen nothing, so it skips nothing, as in Airflow; one that returned None follows
    nothing (its result is the JSON `null`)."""
    return {row["task_id"] for row in branch_rows if row["result"] is not None
            and not follows(json.loads(row["result"]), json.loads(row["reach"]),
                            row["task_id"])}


def judge(task: Pending) -> str:
    """What becomes of `task`: a branch's choice first, then its trigger rule."""
    return SKIP if task.unfollowed else judge_tally(task.rule, task.upstream)


class Readiness:
    """Judges pending tasks of a locked run and writes what was decided."""

    def __init__(self, tis: TaskInstances) -> None:
        self.tis = tis
        #: tasks found ready but left pending by the last call with `claim` None (the run
        #: must be started again for them: `Runs.reopen`)
        self.left_ready = 0

    def after(self, run_id: str, ended: Sequence[str], now: float, *,
              claim: Mapping[str, Any] | None) -> list[TaskInstance]:
        """Judge the children of the tasks in `ended` (which just ended), and below what
        that ends; those queued (none with `claim` None: ready tasks are left pending)."""
        if not ended:
            return []
        return self._settle(run_id, self.tis.pending_children(run_id, ended), now, claim)

    def whole_run(self, run_id: str, now: float, *,
                  claim: Mapping[str, Any] | None) -> list[TaskInstance]:
        """Judge every pending task of the run (it starts, or was cleared or marked)."""
        return self._settle(run_id, self.tis.pending_of_run(run_id), now, claim)

    def _settle(self, run_id: str, rows: Sequence[Mapping[str, Any]], now: float,
                claim: Mapping[str, Any] | None) -> list[TaskInstance]:
        queued: list[TaskInstance] = []
        self.left_ready = 0
        while rows:
            decided: dict[str, list[str]] = {}
            for task in self._gather(run_id, rows):
                decided.setdefault(judge(task), []).append(task.ti_id)
            if claim is not None:
                queued += self.tis.queue_pending(decided.get(READY, []), now=now, **claim)
            else:
                self.left_ready += len(decided.get(READY, []))
            ended = [task_id for decision, state in ENDING.items()
                     for task_id in self.tis.end_pending(decided.get(decision, []),
                                                         state=state, now=now)]
            rows = self.tis.pending_children(run_id, ended) if ended else []
        return queued

    def _gather(self, run_id: str, rows: Sequence[Mapping[str, Any]]) -> list[Pending]:
        """The rows as Pending tasks, reading the choice of their branch upstreams (one
        more query, only when some task has one)."""
        tasks = [Pending.of(row) for row in rows]
        below = [task.task_id for task in tasks if task.branches]
        if below:
            skipped = unfollowed(self.tis.branch_parents(run_id, below))
            for task in tasks:
                task.unfollowed = task.task_id in skipped
        return tasks
