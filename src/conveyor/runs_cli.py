"""`conveyor runs list` and `conveyor tasks show`: runs and task instances from the state store.

`runs show RUN_ID` (the scheduler's) prints one run's tasks; `runs list` finds runs (newest
first, by DAG and state); `tasks show RUN_ID TASK_ID` prints one task instance with every
attempt: where it ran, how it ended, and the error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from conveyor.admin import connection_flags, opened_store, output
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.runs import iso

STATES = ("queued", "running", "success", "failed")


def register(commands: argparse._SubParsersAction) -> None:
    runs = _subcommands(commands.choices["runs"])
    listing = runs.add_parser("list", help="runs, newest first")
    listing.add_argument("--dag", default="", help="only runs of this DAG")
    listing.add_argument("--run-state", default="", choices=("", *STATES), help="only runs "
                         "in this state (--state is the state store's URL)")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    connection_flags(listing)
    listing.set_defaults(run=run_runs_list)
    tasks = commands.add_parser("tasks", help="inspect task instances").add_subparsers(
        dest="tasks_command", required=True)
    show = tasks.add_parser("show", help="one task instance and all its attempts")
    show.add_argument("run_id", help="run id (from `runs list`)")
    show.add_argument("task_id", help="task id within the run's DAG")
    connection_flags(show)
    show.set_defaults(run=run_tasks_show)


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The sub-command group of a command declared elsewhere (`runs`, the scheduler's)."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def run_runs_list(args: argparse.Namespace) -> int:
    with opened_store(args) as store:
        rows = store.rows("recent_runs", dag_id=args.dag, state=args.run_state, limit=args.limit)
    shown = [{**r, "logical_date": iso(r["logical_date"]), "created": iso(r["created_at"]),
              "took": f"{r['ended_at'] - r['started_at']:.2f}s"
              if r["ended_at"] and r["started_at"] else ""} for r in rows]
    output({"runs": rows}, shown, ["run_id", "dag_id", "state", "run_type", "logical_date",
                                   "created", "took"], args.json)
    return 0


def run_tasks_show(args: argparse.Namespace) -> int:
    with opened_store(args) as store:
        ti = store.one("run_ti_by_task", run_id=args.run_id, task_id=args.task_id)
        if ti is None:
            raise RunError(f"no task {args.task_id!r} in run {args.run_id!r}: see the run's "
                           f"tasks with `conveyor runs show {args.run_id}`")
        attempts = store.rows("ti_attempts", ti_id=ti["ti_id"])
    if args.json:
        print(json.dumps({"task": {**ti, "spec": json.loads(ti["spec"])},
                          "attempts": attempts}, indent=2))
        return 0
    _print_task(ti)
    output({}, [_attempt_row(a) for a in attempts],
           ["attempt", "outcome", "host", "pid", "started", "ended", "error"], False)
    return 0


def _print_task(ti: dict[str, Any]) -> None:
    print(f"task {ti['task_id']} of run {ti['run_id']} ({ti['ti_id']}): {ti['state']}, "
          f"attempt {ti['attempt']} of {ti['max_attempts']}")
    print(f"executor {ti['executor']}, queue {ti['queue']}, host {ti['hostname'] or '-'}")
    if ti["error"]:
        print(f"error: {ti['error']}")
    print()


def _attempt_row(a: dict[str, Any]) -> dict[str, Any]:
    return {**a, "started": iso(a["started_at"]), "ended": iso(a["ended_at"]),
            "host": a["hostname"] or "", "pid": a["pid"] or "",
            "error": (a["error"] or "").split("\n", 1)[0][:80]}
