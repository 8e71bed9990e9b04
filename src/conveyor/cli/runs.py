"""`conveyor runs show|list` and `conveyor tasks show`: runs and task instances, from the
state store.

`runs show RUN_ID` prints one run's tasks; `runs list` finds runs (newest logical date
first, as Airflow lists them; by DAG and state); `tasks show RUN_ID TASK_ID` prints one task
instance with every attempt: where it ran, how it ended, and the error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from conveyor.cli import operations
from conveyor.cli.connections import connection_flags, nothing_yet, opened_store, state_url
from conveyor.cli.output import output, table
from conveyor.config import checked
from conveyor.events import ENDED_WELL
from conveyor.kinds import positive_int
from conveyor.readers.runs import (
    STATES,
    budget_attempt,
    find_runs,
    map_summary,
    run_detail,
    run_doc,
    run_source,
    short_value,
    started_late,
    task_detail,
    took,
)
from conveyor.scheduler.cli import common_flags, config_from
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.runs import iso
from conveyor.state import store as stores
from conveyor.state.store import Store


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = commands.add_parser("runs", help="inspect runs").add_subparsers(
        dest="runs_command", required=True)
    show = runs.add_parser("show", help="each task's state, attempts, timings and error")
    show.add_argument("run_id", help="run id (printed by trigger and submit)")
    show.add_argument("--source", action="store_true", help="print the DAG file's source "
                      "the run was created from instead")
    common_flags(show, dags=False)
    show.set_defaults(run=run_runs_show)
    listing = runs.add_parser("list", help="runs, newest logical date first")
    listing.add_argument("--dag", default="", help="only runs of this DAG")
    listing.add_argument("--run-state", default="", choices=("", *STATES), help="only runs "
                         "in this state (--state is the state store's URL)")
    listing.add_argument("--limit", type=checked(positive_int), default=20,
                         help="how many (default 20)")
    connection_flags(listing)
    listing.set_defaults(run=run_runs_list)
    operations.register_runs(runs)
    tasks = commands.add_parser("tasks", help="inspect task instances").add_subparsers(
        dest="tasks_command", required=True)
    show = tasks.add_parser("show", help="one task instance and all its attempts")
    show.add_argument("run_id", help="run id (from `runs list`)")
    show.add_argument("task_id", help="task id within the run's DAG")
    operations.index_flag(show)
    connection_flags(show)
    show.set_defaults(run=run_tasks_show)
    operations.register_tasks(tasks)


def run_runs_show(args: argparse.Namespace) -> int:
    config = config_from(args)
    _refuse_missing(config.settings.stores().state, args.run_id)
    store = stores.from_url(config.settings.state_url)
    try:
        if args.source:
            return show_source(store, args.run_id, args.json)
        return show_run(store, args.run_id, args.json)
    finally:
        store.close()


def show_run(store: Store, run_id: str, as_json: bool) -> int:
    detail = run_detail(store, run_id)
    if detail is None:
        raise RunError(f"no run {run_id!r} in the state store: check the id and --state")
    if as_json:
        print(json.dumps(detail, indent=2))
        return 0
    run, tasks, attempts = detail["run"], detail["tasks"], detail["attempts"]
    took = f" in {run['ended_at'] - run['started_at']:.2f} s" \
        if run["ended_at"] and run["started_at"] else ""
    print(f"run {run['run_id']} of {run['dag_id']} (version {run['dag_version']}, "
          f"{run['run_type']}): {run['state']}{took}")
    print(f"logical date {iso(run['logical_date'])}, created {iso(run['created_at'])}")
    deadline = _deadline_line(detail["deadline"])
    print(_code_line(detail["code"]))
    print(f"{deadline}\n" if deadline else "")
    mapped = map_summary(tasks)
    print(table([_task_line(t, mapped.get(t["task_id"], "")) for t in tasks],
                ["task", "state", "attempt", "executor", "queue", "started", "took", "host",
                 "result", "error"]))
    retried = [a for a in attempts if a["outcome"] not in ENDED_WELL]
    if retried:
        names = {t["ti_id"]: t["task_id"] for t in tasks}
        print("\nfailed attempts:")
        for a in retried:
            print(f"  {names[a['ti_id']]} #{a['attempt']} {iso(a['ended_at'])}: "
                  f"{(a['error'] or '').splitlines()[0] if a['error'] else a['outcome']}")
    if detail["callbacks"]:
        print("\ncallbacks:")
        for c in detail["callbacks"]:
            whose = f"{c['task_id']} #{c['attempt']}" if c["ti_id"] else "run"
            error = f": {(c['error'] or '').splitlines()[0]}" if c["error"] else ""
            print(f"  {c['kind']} of {whose} -> {c['task']} on {c['queue']}: {c['state']}"
                  f"{error}")
    return 0


def show_source(store: Store, run_id: str, as_json: bool) -> int:
    """The DAG source a run was created from, as the file was then."""
    if run_doc(store, run_id) is None:
        raise RunError(f"no run {run_id!r} in the state store: check the id and --state")
    source = run_source(store, run_id)
    if source is None:
        raise RunError(f"the DAG source of run {run_id!r} was not kept (a run created before "
                       "Conveyor kept sources, or by `submit`, which has no file)")
    if as_json:
        print(json.dumps(source, indent=2))
    else:
        print(f"# {source['file']} (version {source['version']})\n{source['source']}", end="")
    return 0


def _code_line(code: dict[str, Any]) -> str:
    """Which code the run ran on, whether it is pinned to it, and what waits for it."""
    line = f"code version {code['version'] or '(no task started yet)'}"
    line += ", pinned" if code["pinned"] else ""
    return line + "".join(f"\n  {task}: {why}" for task, why in code["waiting"].items())


def _deadline_line(deadline: dict[str, Any] | None) -> str:
    """The run's deadline, and whether it missed it (blank: it has none)."""
    if deadline is None:
        return ""
    if deadline["missed"]:
        late = deadline["missed_at"] - deadline["at"]
        return (f"deadline {iso(deadline['at'])}: MISSED (found {late:.0f} s after it, "
                f"at {iso(deadline['missed_at'])})")
    return f"deadline {iso(deadline['at'])}: {deadline['status']}"


def _task_line(ti: dict[str, Any], mapped: str = "") -> dict[str, Any]:
    """A task's row; a mapped task's state says how its instances (the rows below it,
    TASK[N]) stand."""
    attempt, of = budget_attempt(ti)
    return {"task": ti["task_id"] if ti.get("map_task") is None else f"  {ti['task_id']}",
            "state": f"{ti['state']} ({mapped})" if mapped else ti["state"],
            "attempt": f"{attempt}/{of}", "executor": ti["executor"],
            "queue": ti["queue"], "started": iso(ti["started_at"])[11:23],
            "took": _took(ti), "host": ti["hostname"] or "",
            "result": short_value(ti["result"]),
            "error": (ti["error"] or "").split("\n", 1)[0][:80]}


def _refuse_missing(url: str, run_id: str) -> None:
    """No run can be in a store nothing has written yet (and reading must not create it)."""
    why = nothing_yet(url)
    if why:
        raise RunError(f"no run {run_id!r} in the state store: {why}")


def _took(ti: dict[str, Any]) -> str:
    """How long it ran; blank until it ended, and said so when it started after its end
    was recorded (`readers.runs.started_late`)."""
    seconds = took(ti)
    if seconds is not None:
        return f"{seconds:.3f}s"
    return "started late" if started_late(ti) else ""


def run_runs_list(args: argparse.Namespace) -> int:
    why = nothing_yet(state_url(args))
    if why:
        print(json.dumps({"runs": []}) if args.json else f"no runs yet: {why}")
        return 0
    with opened_store(args) as store:
        rows = find_runs(store, dag_id=args.dag, state=args.run_state, limit=args.limit)
    shown = [{**r, "logical_date": iso(r["logical_date"]), "created": iso(r["created_at"]),
              "took": f"{r['ended_at'] - r['started_at']:.2f}s"
              if r["ended_at"] and r["started_at"] else ""} for r in rows]
    output({"runs": rows}, shown, ["run_id", "dag_id", "state", "run_type", "logical_date",
                                   "created", "took"], args.json)
    return 0


def run_tasks_show(args: argparse.Namespace) -> int:
    _refuse_missing(state_url(args), args.run_id)
    task_id = operations.task_named(args)
    with opened_store(args) as store:
        detail = task_detail(store, args.run_id, task_id)
        if detail is None and run_doc(store, args.run_id) is None:
            raise RunError(f"no run {args.run_id!r} in the state store: find it with "
                           "`conveyor runs list` (and check --state)")
        if detail is None:
            raise RunError(f"no task {task_id!r} in run {args.run_id!r}: see the run's "
                           f"tasks with `conveyor runs show {args.run_id}`")
    if args.json:
        print(json.dumps(detail, indent=2))
        return 0
    _print_task(detail["task"])
    output({}, [_attempt_row(a) for a in detail["attempts"]],
           ["attempt", "outcome", "host", "pid", "started", "ended", "result", "error"], False)
    return 0


def _print_task(ti: dict[str, Any]) -> None:
    attempt, of = budget_attempt(ti)
    cleared = f" since it was cleared (attempt {ti['attempt']} in all)" \
        if attempt != ti["attempt"] else ""
    print(f"task {ti['task_id']} of run {ti['run_id']} ({ti['ti_id']}): {ti['state']}, "
          f"attempt {attempt} of {of}{cleared}")
    print(f"executor {ti['executor']}, queue {ti['queue']}, host {ti['hostname'] or '-'}")
    if ti["result"] is not None:
        print(f"result: {json.dumps(ti['result'])}")
    if ti["error"]:
        print(f"error: {ti['error']}")
    print()


def _attempt_row(a: dict[str, Any]) -> dict[str, Any]:
    return {**a, "started": iso(a["started_at"]), "ended": iso(a["ended_at"]),
            "host": a["hostname"] or "", "pid": a["pid"] or "", "result": short_value(a["result"]),
            "error": (a["error"] or "").split("\n", 1)[0][:80]}
