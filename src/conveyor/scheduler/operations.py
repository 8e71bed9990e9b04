"""Operations people run on DAGs and runs: pause, clear, mark.

Each is one transaction on the state store with the run's row locked, so it never races an
event a scheduler is applying. None talks to executors: a changed run goes back to `queued`
and the next scheduler tick starts it (dispatching what became ready, ending it if nothing
is left), the same path a new run takes. The caller pokes the schedulers.

* backfill: a run for every tick of a past date range, created queued (the unique
  (DAG, logical date) rule makes it idempotent); the schedulers start them oldest first.
* pause / unpause: a paused DAG's queued runs wait and its cron ticks pass without a run;
  what is already running finishes.
* clear: a task instance and (unless asked otherwise) everything downstream of it go back to
  pending, each with a fresh attempt budget, and run again (Airflow's "clear"), on the
  run's code version unless asked to move it to the latest.
* mark: set a task instance's state by hand (success or failed). An attempt still in flight
  is ignored when it reports. Success sends the tasks below it that did not run
  (upstream_failed, skipped) back to pending; either way the pending tasks of the run are
  judged again by their trigger rules (readiness.py).
* retry now: a task instance waiting out its retry delay (up_for_retry) is due at once; its
  next attempt keeps counting against the same budget (clear gives a fresh one).
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.scheduler import cron
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.readiness import Readiness
from conveyor.scheduler.runs import create_run
from conveyor.state.assets import Assets
from conveyor.state.maps import Maps
from conveyor.state.monitoring import Workers
from conveyor.state.records import TaskInstance
from conveyor.state.runs import Dags, Runs
from conveyor.state.store import Store
from conveyor.state.tasks import TaskInstances

MARKABLE = ("success", "failed")


def record_dag(store: Store, dag: DAG, now: float) -> None:
    """Record a loaded DAG (version, file, schedule, first tick, run cap) in the store; a
    tick already recorded for the same schedule is kept."""
    dags = Dags(store)
    with store.transaction():
        dags.upsert(dag_id=dag.dag_id, version=dag.version, file=dag.file,
                    schedule=dag.schedule, timezone=dag.timezone,
                    next_tick=first_tick(dag, now), now=now)
        dags.set_max_active_runs(dag.dag_id, dag.max_active_runs)
        Assets(store).set_refs(dag.dag_id, consumes=sorted(dag.assets.keys()) if dag.assets
                               else [], produces=[uri for node in dag.tasks.values()
                                                  for uri in node.options.outlets])


def first_tick(dag: DAG, now: float) -> float | None:
    """A new DAG's first tick: from its start date when it catches up, else after now."""
    if not dag.schedule:
        return None
    if dag.catchup and dag.start_date is not None:
        return cron.next_tick(dag.schedule, dag.start_date - 0.001, dag.timezone)
    return cron.next_tick(dag.schedule, now, dag.timezone)


def set_paused(store: Store, dag: DAG, paused: bool, now: float) -> None:
    """Pause or unpause `dag` (recorded even if no scheduler has seen the DAG yet)."""
    with store.transaction():
        record_dag(store, dag, now)
        Dags(store).set_paused(dag.dag_id, paused)


def backfill(store: Store, dag: DAG, start: float, end: float, now: float, *,
             executors: Sequence[str]) -> tuple[list[str], list[float]]:
    """A run for every tick of `dag`'s schedule from `start` to `end` (both included):
    (new run ids, logical dates that already had a run). Repeating it creates nothing new."""
    if not dag.schedule:
        raise RunError(f"DAG {dag.dag_id!r} has no schedule, so a date range names no runs: "
                       "use `conveyor dags trigger --logical-date` for single runs")
    if end < start:
        raise RunError("--to is before --from: give the range oldest date first")
    record_dag(store, dag, now)      # its run cap holds before a scheduler loads it
    created: list[str] = []
    existing: list[float] = []
    tick = cron.next_tick(dag.schedule, start - 0.001, dag.timezone)
    while tick <= end:
        run_id = create_run(store, dag, now, executors=executors, logical_date=tick,
                            run_type="backfill")
        if run_id is None:
            existing.append(tick)
        else:
            created.append(run_id)
        tick = cron.next_tick(dag.schedule, tick, dag.timezone)
    return created, existing


def clear(store: Store, run_id: str, task_id: str, now: float, *,
          downstream: bool = True, latest_code: bool = False) -> list[str]:
    """Send a task instance (and what is below it) back to pending; the task ids cleared.

    The run keeps the code version it recorded (a pinned run's cleared tasks go to workers
    of the code it ran on, as a cleared Airflow 3 task runs its run's DAG version);
    `latest_code` moves it to the newest live worker's version among those serving the
    cleared tasks' queues (Airflow's "run on latest version"), or, with none, to the
    version of the next task without upstreams to start."""
    tis = TaskInstances(store)
    with store.transaction():
        _locked_run(store, run_id)
        found = _and_below(store, run_id, task_id)
        chosen = found if downstream else [ti for ti in found if ti.task_id == task_id]
        if not chosen:
            raise _no_task(run_id, task_id)
        _refuse_active(chosen)
        if latest_code:
            Runs(store).repin(run_id, Workers(store).newest_version(
                now, sorted({ti.queue for ti in chosen})))
        for ti in chosen:
            tis.clear(ti.ti_id)
            if ti.map_count is not None:      # a mapped task: expanded anew when ready
                Maps(store).forget(run_id, ti.task_id)
            if ti.map_task is not None:       # an instance: its mapped task waits for it
                Maps(store).reopened(run_id, ti.map_task)
        _settle_run(store, run_id, now)
    return [ti.task_id for ti in chosen]


def mark(store: Store, run_id: str, task_id: str, state: str, now: float) -> TaskInstance:
    """Set a task instance's state by hand; the task instance before the change."""
    if state not in MARKABLE:
        raise RunError(f"cannot mark a task {state!r}: mark it one of {', '.join(MARKABLE)}")
    tis = TaskInstances(store)
    with store.transaction():
        _locked_run(store, run_id)
        ti = tis.by_task(run_id, task_id)
        if ti is None:
            raise _no_task(run_id, task_id)
        error = "marked failed by hand" if state == "failed" else None
        tis.mark(ti.ti_id, state=state, error=error, now=now)
        if ti.map_task is not None:           # its mapped task ends again, with this state
            Maps(store).reopened(run_id, ti.map_task)
        if state == "success":
            tis.unblock_below(run_id, task_id)
        _settle_run(store, run_id, now)
    return ti


def retry_now(store: Store, run_id: str, task_id: str, now: float) -> TaskInstance:
    """Make an up_for_retry task instance's next attempt due now; the instance as it was."""
    tis = TaskInstances(store)
    with store.transaction():
        _locked_run(store, run_id)
        ti = tis.by_task(run_id, task_id)
        if ti is None:
            raise _no_task(run_id, task_id)
        if not tis.retry_now(ti.ti_id, now):
            raise RunError(f"cannot retry {task_id} in run {run_id} now: it is {ti.state}, "
                           "not up_for_retry (a failed task runs again with `tasks clear`)")
    return ti


def _and_below(store: Store, run_id: str, task_id: str) -> list[TaskInstance]:
    """A task instance and the tasks below it; for a mapped task's instance, the tasks
    below the mapped task (they received the instance's result)."""
    tis = TaskInstances(store)
    found = tis.task_and_below(run_id, task_id)
    if len(found) == 1 and found[0].map_task is not None:
        found += tis.task_and_below(run_id, found[0].map_task)[1:]
    return found


def instance_id(task_id: str, index: int | None) -> str:
    """The task id of a mapped task's instance `index` (`--index`), else `task_id`."""
    return task_id if index is None else f"{task_id}[{index}]"


def _settle_run(store: Store, run_id: str, now: float) -> None:
    """Judge the run's pending tasks by their trigger rules (ending those that never run:
    skipped, upstream_failed), then queue the run: the next tick starts what is ready."""
    Readiness(TaskInstances(store)).whole_run(run_id, now, claim=None)
    Runs(store).reopen(run_id)


def _locked_run(store: Store, run_id: str) -> None:
    if not Runs(store).lock(run_id):
        raise RunError(f"no run {run_id!r}: find it with `conveyor runs list`")


def _refuse_active(tis: Sequence[TaskInstance]) -> None:
    active = [ti for ti in tis if ti.state in ("queued", "running")]
    if active:
        names = ", ".join(f"{ti.task_id} ({ti.state}, attempt {ti.attempt})"
                          for ti in active)
        raise RunError(f"cannot clear while {names} may still run: wait for it to end, "
                       "mark it success or failed, or cancel it (`tasks cancel RUN TASK`) "
                       "first")


def _no_task(run_id: str, task_id: str) -> RunError:
    return RunError(f"no task {task_id!r} in run {run_id!r}: see the run's tasks with "
                    f"`conveyor runs show {run_id}`")

