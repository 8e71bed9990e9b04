"""The task instances of runs and their attempts: typed reads, claims and transitions.

Every transition is one UPDATE guarded by the state(s) it leaves and the attempt it belongs
to (see sql/*.sql), so it returns whether it happened: a duplicate or late event changes
nothing and gets False. Claims record which scheduler claimed an attempt for publishing
(`scheduler`) and until when it may (`lease` seconds from `now`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from conveyor.state.records import Attempt, Due, TaskInstance, Transition
from conveyor.state.store import Repository, Row


class TaskInstances(Repository):
    """Task instances: what a run's tasks are doing, and the engine's transitions."""

    # -- reads ------------------------------------------------------------------------------

    def get(self, ti_id: str) -> TaskInstance | None:
        row = self.store.one("ti", ti_id=ti_id)
        return None if row is None else TaskInstance.from_row(row)

    def by_task(self, run_id: str, task_id: str) -> TaskInstance | None:
        row = self.store.one("run_ti_by_task", run_id=run_id, task_id=task_id)
        return None if row is None else TaskInstance.from_row(row)

    def of_run(self, run_id: str) -> list[TaskInstance]:
        """In DAG order."""
        return _tis(self.store.rows("run_tis", run_id=run_id))

    def of_runs(self, run_ids: Sequence[str]) -> list[TaskInstance]:
        """The task instances of these runs, in one query: by run, then in DAG order."""
        return _tis(self.store.rows("tis_of_runs", run_ids=json.dumps(sorted(run_ids))))

    def locking_runs(self, ti_ids: Sequence[str]) -> dict[str, TaskInstance]:
        """These task instances by id, with their runs' rows locked for the rest of the
        transaction: one query for a batch of events, not one per event."""
        if not ti_ids:
            return {}
        found = self.store.rows("tis_locking_run", ti_ids=json.dumps(list(ti_ids)))
        return {ti.ti_id: ti for ti in _tis(found)}

    def task_and_below(self, run_id: str, task_id: str) -> list[TaskInstance]:
        """A task instance and every task downstream of it in its run, in DAG order."""
        return _tis(self.store.rows("task_and_below", run_id=run_id, task_id=task_id))

    def upstream_results(self, run_id: str, task_id: str) -> dict[str, str | None]:
        """What the task's succeeded parents returned (JSON text), by task id."""
        return {row["task_id"]: row["result"] for row in self.store.rows(
            "upstream_results", run_id=run_id, task_id=task_id)}

    def due(self, now: float, limit: int) -> list[Due]:
        """Queued or running task instances whose deadline passed, earliest first."""
        return [Due.from_row(row) for row in self.store.rows("due", now=now, limit=limit)]

    def still_due(self, due: Due, now: float) -> TaskInstance | None:
        """The task instance, if it is still in the attempt and state it was due in."""
        row = self.store.one("still_due", ti_id=due.ti_id, attempt=due.attempt,
                             state=due.state, now=now)
        return None if row is None else TaskInstance.from_row(row)

    def next_deadline(self) -> float | None:
        """The earliest deadline of any task instance (None: nothing waits on time)."""
        row = self.store.one("next_deadline")
        return None if row is None or row["at"] is None else float(row["at"])

    def count_by_state(self) -> dict[str, int]:
        return {row["state"]: int(row["n"]) for row in self.store.rows("tis_by_state")}

    def queues_in_use(self, runs: int) -> list[str]:
        """The queues named by the task instances of the `runs` newest runs."""
        return [row["queue"] for row in self.store.rows("queues_in_use", limit=runs)]

    # -- claims for publishing --------------------------------------------------------------

    def pending_children(self, run_id: str, task_ids: Sequence[str]) -> list[Row]:
        """The pending children of these tasks: each one's trigger rule, and how many of
        its direct upstreams are in each kind of state (see the query)."""
        return self.store.rows("pending_children", run_id=run_id,
                               task_ids=json.dumps(list(task_ids)))

    def pending_of_run(self, run_id: str) -> list[Row]:
        """Every pending task of the run, as `pending_children` (a root: total 0)."""
        return self.store.rows("pending_of_run", run_id=run_id)

    def branch_parents(self, run_id: str, task_ids: Sequence[str]) -> list[Row]:
        """For these tasks, each branch upstream that succeeded: what it returned (`result`)
        and which tasks each of its children leads to (`reach`, JSON)."""
        return self.store.rows("branch_parents", run_id=run_id,
                               task_ids=json.dumps(list(task_ids)))

    def queue_pending(self, ti_ids: Sequence[str], *, now: float, scheduler: str,
                      lease: float) -> list[TaskInstance]:
        """Queue these task instances if they are still pending: those queued."""
        if not ti_ids:
            return []
        return _tis(self.store.rows("queue_pending", ti_ids=json.dumps(list(ti_ids)), now=now,
                                    scheduler=scheduler, lease=lease))

    def end_pending(self, ti_ids: Sequence[str], *, state: str, now: float) -> list[str]:
        """End these task instances `state` (skipped, upstream_failed) if still pending:
        the task ids that changed."""
        if not ti_ids:
            return []
        return [row["task_id"] for row in self.store.rows(
            "end_pending", ti_ids=json.dumps(list(ti_ids)), state=state, now=now)]

    def claim_due_retries(self, *, now: float, limit: int, scheduler: str,
                          lease: float) -> list[TaskInstance]:
        """Queue the next attempt of task instances whose retry delay is over."""
        return _tis(self.store.rows("claim_due_retries", now=now, limit=limit,
                                    scheduler=scheduler, lease=lease))

    def claim_unpublished(self, *, ti_id: str, attempt: int, now: float, scheduler: str,
                          lease: float) -> list[TaskInstance]:
        """A queued attempt never published, once its claimer's lease lapsed."""
        return _tis(self.store.rows("claim_unpublished", ti_id=ti_id, attempt=attempt,
                                    now=now, scheduler=scheduler, lease=lease))

    def reissue(self, *, ti_id: str, attempt: int, now: float, scheduler: str,
                lease: float) -> list[TaskInstance]:
        """A running attempt whose message came back after its deadline: queued again."""
        return _tis(self.store.rows("ti_reissue", ti_id=ti_id, attempt=attempt, now=now,
                                    scheduler=scheduler, lease=lease))

    def wait_for_claimer(self, *, ti_id: str, attempt: int, now: float) -> None:
        """Look at an unpublished attempt again when its live claimer's lease would lapse."""
        self.store.exec("wait_for_claimer", ti_id=ti_id, attempt=attempt, now=now)

    def hold(self, held: Sequence[tuple[TaskInstance, str, float]]) -> None:
        """Keep these attempts unpublished, each waiting for a worker of a code version,
        until a time to look again: (task instance, version, when)."""
        self.store.exec_many("ti_hold", [
            {"ti_id": ti.ti_id, "attempt": ti.attempt, "version": version, "at": at}
            for ti, version, at in held])

    def mark_published(self, tis: Sequence[TaskInstance], *, now: float,
                       start_grace: float, sent_to: Mapping[str, str] | None = None) -> None:
        """Record the publish of these attempts: their deadline to start runs from now;
        `sent_to`: the code version of the `<queue>@<version>` each pinned one went to."""
        versions = sent_to or {}
        self.store.exec_many("mark_published", [
            {"ti_id": ti.ti_id, "attempt": ti.attempt, "now": now, "start_grace": start_grace,
             "sent_to": versions.get(ti.ti_id)} for ti in tis])

    def send_again(self, *, ti_id: str, attempt: int, now: float, scheduler: str,
                   lease: float) -> list[TaskInstance]:
        """The next attempt of one stranded in a gone version's queue, not charged to its
        retries, claimed for publishing (see the query)."""
        return _tis(self.store.rows("ti_send_again", ti_id=ti_id, attempt=attempt, now=now,
                                    scheduler=scheduler, lease=lease))

    # -- what workers report ----------------------------------------------------------------

    def started(self, step: Transition, *, hostname: str | None, pid: int | None) -> bool:
        return bool(self.store.exec("ti_started", **step.params, hostname=hostname, pid=pid))

    def started_late(self, step: Transition, *, hostname: str | None,
                     pid: int | None) -> bool:
        """A `started` that came after the outcome: fill in what the outcome left blank."""
        return bool(self.store.exec("ti_started_late", **step.params, hostname=hostname,
                                    pid=pid))

    def heartbeat(self, step: Transition) -> None:
        self.store.exec("ti_heartbeat", **step.params)

    def parked(self, step: Transition) -> None:
        """Waiting for a slot of its pool or limit: no timeout meanwhile."""
        self.store.exec("ti_parked", **step.params)

    def unparked(self, step: Transition, *, start_grace: float) -> None:
        self.store.exec("ti_unparked", **step.params, start_grace=start_grace)

    def requeued(self, step: Transition, *, error: str, start_grace: float) -> None:
        """The worker kept the message: the same attempt queued, with a fresh deadline."""
        self.store.exec("ti_requeued", **step.params, error=error, start_grace=start_grace)

    def succeeded(self, step: Transition, *, result: str, started: float | None,
                  hostname: str | None, pid: int | None) -> bool:
        return bool(self.store.exec("ti_succeeded", **step.params, result=result,
                                    started=started, hostname=hostname, pid=pid))

    def skipped(self, step: Transition, *, reason: str, started: float | None,
                hostname: str | None, pid: int | None) -> bool:
        """The attempt skipped itself (it raised Skip): a terminal state, never retried."""
        return bool(self.store.exec("ti_skipped", **step.params, reason=reason,
                                    started=started, hostname=hostname, pid=pid))

    def up_for_retry(self, step: Transition, *, error: str, next_retry_at: float) -> bool:
        return bool(self.store.exec("ti_up_for_retry", **step.params, error=error,
                                    next_retry_at=next_retry_at))

    def failed(self, step: Transition, *, error: str) -> bool:
        return bool(self.store.exec("ti_failed", **step.params, error=error))

    def cancelled(self, step: Transition, *, error: str) -> bool:
        """Cancelled: a terminal state, never retried (see the query for what it leaves)."""
        return bool(self.store.exec("ti_cancelled", **step.params, error=error))

    # -- operations people run --------------------------------------------------------------

    def clear(self, ti_id: str) -> None:
        """Back to pending with a fresh attempt budget."""
        self.store.exec("ti_clear", ti_id=ti_id)

    def mark(self, ti_id: str, *, state: str, error: str | None, now: float) -> None:
        self.store.exec("ti_mark", ti_id=ti_id, state=state, error=error, now=now)

    def retry_now(self, ti_id: str, now: float) -> bool:
        """Make an up_for_retry task instance due now; False if it is not up_for_retry."""
        return bool(self.store.exec("ti_retry_now", ti_id=ti_id, now=now))

    def unblock_below(self, run_id: str, task_id: str) -> None:
        """Tasks below this one that did not run (upstream_failed, skipped) are pending
        again, for the trigger rules to judge afresh."""
        self.store.exec("unblock_below", run_id=run_id, task_id=task_id)


class Attempts(Repository):
    """Ended attempts of task instances: how each ended, where it ran, what it said."""

    def of_run(self, run_id: str) -> list[Attempt]:
        """In DAG order, then by attempt."""
        return [Attempt.from_row(row) for row in self.store.rows("run_attempts", run_id=run_id)]

    def of_task_instance(self, ti_id: str) -> list[Attempt]:
        return [Attempt.from_row(row) for row in self.store.rows("ti_attempts", ti_id=ti_id)]

    def outcome(self, ti_id: str, attempt: int) -> str | None:
        """How the attempt ended; None if it has not."""
        row = self.store.one("attempt_outcome", ti_id=ti_id, attempt=attempt)
        return None if row is None else str(row["outcome"])

    def record(self, step: Transition, *, outcome: str, error: str | None,
               result: str | None, log: str | None) -> None:
        """The attempt's end (at `step.at`), with where and when it ran copied from its
        task instance."""
        self.store.exec("record_attempt", **step.params, outcome=outcome, error=error,
                        result=result, log=log)

    def started_late(self, step: Transition, *, hostname: str | None,
                     pid: int | None) -> None:
        self.store.exec("attempt_started_late", **step.params, hostname=hostname, pid=pid)


def _tis(rows: Sequence[dict[str, object]]) -> list[TaskInstance]:
    return [TaskInstance.from_row(row) for row in rows]
