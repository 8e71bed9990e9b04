"""`conveyor runs show|list` and `conveyor tasks show`: runs and task instances, from the
state store.

`runs show RUN_ID` prints one run's tasks; `runs list` finds runs (newest
first, by DAG and state); `tasks show RUN_ID TASK_ID` prints one task instance with every
attempt: where it ran, how it ended, and the error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from conveyor.cli import operations
from conveyor.cli.connections import connection_flags, opened_store
from conveyor.cli.output import output, table
from conveyor.config import checked, positive_int
from conveyor.readers.runs import STATES, short, task_doc, value
from conveyor.scheduler.cli import common_flags, config_from
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.runs import iso
from conveyor.state import store as stores
from conveyor.state.store import Store


def register(commands: argparse._SubParsersAction) -> None:
    runs = commands.add_parser("runs", help="inspect runs").add_subparsers(
        dest="runs_command", required=True)
    show = runs.add_parser("show", help="each task's state, attempts, timings and error")
    show.add_argument("run_id", help="run id (printed by trigger and submit)")
    common_flags(show, dags=False)
    show.set_defaults(run=run_runs_show)
    listing = runs.add_parser("list", help="runs, newest first")
    listing.add_argument("--dag", default="", help="only runs of this DAG")
    listing.add_argument("--run-state", default="", choices=("", *STATES), help="only runs "
                         "in this state (--state is the state store's URL)")
    listing.add_argument("--limit", type=checked(positive_int), default=20,
                         help="how many (default 20)")
    connection_flags(listing)
    listing.set_defaults(run=run_runs_list)
    tasks = commands.add_parser("tasks", help="inspect task instances").add_subparsers(
        dest="tasks_command", required=True)
    show = tasks.add_parser("show", help="one task instance and all its attempts")
    show.add_argument("run_id", help="run id (from `runs list`)")
    show.add_argument("task_id", help="task id within the run's DAG")
    connection_flags(show)
    show.set_defaults(run=run_tasks_show)
    operations.register_tasks(tasks)


def run_runs_show(args: argparse.Namespace) -> int:
    config = config_from(args)
    store = stores.from_url(config.settings.state_url)
    try:
        return show_run(store, args.run_id, args.json)
    finally:
        store.close()


def show_run(store: Store, run_id: str, as_json: bool) -> int:
    run = store.one("run", run_id=run_id)
    if run is None:
        raise RunError(f"no run {run_id!r} in the state store: check the id and --state")
    tasks = store.rows("run_tis", run_id=run_id)
    attempts = store.rows("run_attempts", run_id=run_id)
    if as_json:
        print(json.dumps({"run": run, "tasks": [task_doc(t) for t in tasks],
                          "attempts": attempts}, indent=2))
        return 0
    took = f" in {run['ended_at'] - run['started_at']:.2f} s" \
        if run["ended_at"] and run["started_at"] else ""
    print(f"run {run['run_id']} of {run['dag_id']} (version {run['dag_version']}, "
          f"{run['run_type']}): {run['state']}{took}")
    print(f"logical date {iso(run['logical_date'])}, created {iso(run['created_at'])}\n")
    print(table([_task_line(t) for t in tasks], ["task", "state", "attempt", "executor",
                                                  "queue", "started", "took", "host",
                                                  "result", "error"]))
    retried = [a for a in attempts if a["outcome"] != "succeeded"]
    if retried:
        names = {t["ti_id"]: t["task_id"] for t in tasks}
        print("\nfailed attempts:")
        for a in retried:
            print(f"  {names[a['ti_id']]} #{a['attempt']} {iso(a['ended_at'])}: "
                  f"{(a['error'] or '').splitlines()[0] if a['error'] else a['outcome']}")
    return 0


def _task_line(ti: dict[str, Any]) -> dict[str, Any]:
    took = ti["ended_at"] - ti["started_at"] if ti["ended_at"] and ti["started_at"] else None
    return {"task": ti["task_id"], "state": ti["state"],
            "attempt": f"{ti['attempt']}/{ti['max_attempts']}", "executor": ti["executor"],
            "queue": ti["queue"], "started": iso(ti["started_at"])[11:23],
            "took": f"{took:.3f}s" if took is not None else "", "host": ti["hostname"] or "",
            "result": short(ti.get("result")), "error": (ti["error"] or "").split("\n", 1)[0][:80]}


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
        print(json.dumps({"task": task_doc(ti),
                          "attempts": [{**a, "result": value(a.get("result"))}
                                       for a in attempts]}, indent=2))
        return 0
    _print_task(ti)
    output({}, [_attempt_row(a) for a in attempts],
           ["attempt", "outcome", "host", "pid", "started", "ended", "result", "error"], False)
    return 0


def _print_task(ti: dict[str, Any]) -> None:
    print(f"task {ti['task_id']} of run {ti['run_id']} ({ti['ti_id']}): {ti['state']}, "
          f"attempt {ti['attempt']} of {ti['max_attempts']}")
    print(f"executor {ti['executor']}, queue {ti['queue']}, host {ti['hostname'] or '-'}")
    if ti.get("result") is not None:
        print(f"result: {ti['result']}")
    if ti["error"]:
        print(f"error: {ti['error']}")
    print()


def _attempt_row(a: dict[str, Any]) -> dict[str, Any]:
    return {**a, "started": iso(a["started_at"]), "ended": iso(a["ended_at"]),
            "host": a["hostname"] or "", "pid": a["pid"] or "", "result": short(a.get("result")),
            "error": (a["error"] or "").split("\n", 1)[0][:80]}
