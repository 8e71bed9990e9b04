"""`conveyor dags pause|unpause`, `conveyor runs cancel` and `conveyor tasks
clear|mark|retry|cancel`: operations on DAGs and runs
(the work is in `conveyor.scheduler.operations`; this is flags, output and the poke that
makes a running scheduler act at once)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from conveyor.client import Client
from conveyor.errors import ConfigError
from conveyor.scheduler import cancel, operations
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler.cli import common_flags, config_from, load
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.runs import iso
from conveyor.state import store as stores


def register_dags(dags: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for verb, paused in (("pause", True), ("unpause", False)):
        p = dags.add_parser(verb, help="stop starting runs of a DAG (running ones finish)"
                            if paused else "let a paused DAG start runs again")
        p.add_argument("dag", help="DAG id")
        common_flags(p)
        p.set_defaults(run=run_pause, paused=paused)


def register_backfill(dags: argparse._SubParsersAction[argparse.ArgumentParser],
                      date: Callable[[str], float],
                      last: Callable[[str], float]) -> None:
    p = dags.add_parser("backfill", help="create the runs of a past date range (again: no-op)")
    p.add_argument("dag", help="DAG id (it needs a schedule)")
    p.add_argument("--from", dest="start", type=date, required=True,
                   help="first logical date, ISO-8601, UTC unless it says (included)")
    p.add_argument("--to", dest="end", type=last, required=True,
                   help="last logical date, ISO-8601, UTC unless it says (included; a date "
                   "alone is the whole day)")
    common_flags(p)
    p.set_defaults(run=run_backfill)


def register_runs(runs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = runs.add_parser("cancel", help="cancel a run: what is queued or running is stopped, "
                        "what is pending never starts; the run ends cancelled")
    p.add_argument("run_id", help="run id (from `runs list`)")
    common_flags(p, dags=False)
    p.set_defaults(run=run_runs_cancel)


def register_tasks(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = tasks.add_parser("clear", help="re-run a task instance and everything downstream")
    p.add_argument("run_id", help="run id (from `runs list`)")
    p.add_argument("task_id", help="task id within the run's DAG")
    p.add_argument("--only", action="store_true", help="this task only, not its downstream")
    p.add_argument("--latest-code", action="store_true",
                   help="a run pinned to its code moves to the newest live worker's code "
                   "version (default: its tasks run again on the version it recorded)")
    index_flag(p)
    common_flags(p, dags=False)
    p.set_defaults(run=run_clear)
    p = tasks.add_parser("mark", help="set a task instance's state by hand")
    p.add_argument("run_id", help="run id (from `runs list`)")
    p.add_argument("task_id", help="task id within the run's DAG")
    p.add_argument("mark_as", metavar="STATE", choices=operations.MARKABLE,
                   help="success or failed")
    index_flag(p)
    common_flags(p, dags=False)
    p.set_defaults(run=run_mark)
    p = tasks.add_parser("retry", help="run an up_for_retry task instance's next attempt now")
    p.add_argument("run_id", help="run id (from `runs list`)")
    p.add_argument("task_id", help="task id within the run's DAG")
    index_flag(p)
    common_flags(p, dags=False)
    p.set_defaults(run=run_retry)
    p = tasks.add_parser("cancel", help="cancel a message by its id, or one task of a run "
                         "(RUN TASK): it never starts, or its worker stops it")
    p.add_argument("ids", nargs="+", metavar="MESSAGE_ID | RUN TASK",
                   help="a message id (from enqueue), or a run id and a task id within it")
    common_flags(p, dags=False)
    p.set_defaults(run=run_tasks_cancel)


def index_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=int, metavar="N", help="instance N of a mapped task "
                   "(`expand`), as `runs show` lists it: TASK[N]")


def task_named(args: argparse.Namespace) -> str:
    """The task id the command names: TASK, or TASK[N] with --index N."""
    return operations.instance_id(args.task_id, args.index)


def run_pause(args: argparse.Namespace) -> int:
    config = config_from(args)
    dag = _dag(config, args.dag)
    store = stores.from_url(config.settings.state_url)
    try:
        operations.set_paused(store, dag, args.paused, time.time())
    finally:
        store.close()
    if not args.paused:
        daemons.poke(config, "")
    state = "paused" if args.paused else "unpaused"
    _say(args, {"dag_id": dag.dag_id, "paused": args.paused},
         f"DAG {dag.dag_id} {state}")
    return 0


def run_backfill(args: argparse.Namespace) -> int:
    config = config_from(args)
    dag = _dag(config, args.dag)
    store = stores.from_url(config.settings.state_url)
    try:
        created, existing = operations.backfill(store, dag, args.start, args.end, time.time(),
                                                executors=config.executors)
    finally:
        store.close()
    if created:
        daemons.poke(config, created[0])
    _say(args, {"dag_id": dag.dag_id, "created": created,
                "existing": [iso(t) for t in existing]},
         f"{len(created)} run(s) of {dag.dag_id} created, {len(existing)} already there")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    config = config_from(args)
    store = stores.from_url(config.settings.state_url)
    try:
        cleared = operations.clear(store, args.run_id, task_named(args), time.time(),
                                   downstream=not args.only, latest_code=args.latest_code)
    finally:
        store.close()
    daemons.poke(config, args.run_id)
    _say(args, {"run_id": args.run_id, "cleared": cleared},
         f"cleared {', '.join(cleared)} in run {args.run_id}: they run again, each with a "
         "fresh retry budget")
    return 0


def run_mark(args: argparse.Namespace) -> int:
    config = config_from(args)
    store = stores.from_url(config.settings.state_url)
    try:
        before = operations.mark(store, args.run_id, task_named(args), args.mark_as, time.time())
    finally:
        store.close()
    daemons.poke(config, args.run_id)
    _say(args, {"run_id": args.run_id, "task_id": before.task_id, "state": args.mark_as,
                "was": before.state},
         f"{before.task_id} in run {args.run_id} marked {args.mark_as} (was {before.state})")
    return 0


def run_retry(args: argparse.Namespace) -> int:
    config = config_from(args)
    store = stores.from_url(config.settings.state_url)
    try:
        before = operations.retry_now(store, args.run_id, task_named(args), time.time())
    finally:
        store.close()
    daemons.poke(config, args.run_id)
    attempt = before.attempt + 1
    _say(args, {"run_id": args.run_id, "task_id": before.task_id, "attempt": attempt},
         f"{before.task_id} in run {args.run_id}: attempt {attempt} of "
         f"{before.max_attempts} is due now")
    return 0


def run_runs_cancel(args: argparse.Namespace) -> int:
    return _cancel(args, args.run_id)


def run_tasks_cancel(args: argparse.Namespace) -> int:
    """`tasks cancel MESSAGE_ID` (any message: `Client.cancel`) or `tasks cancel RUN TASK`."""
    if len(args.ids) > 2:
        raise ConfigError(f"tasks cancel takes a message id, or a run id and a task id: "
                          f"{len(args.ids)} given")
    if len(args.ids) == 2:
        return _cancel(args, *args.ids)
    client = Client.from_settings(config_from(args).settings)
    try:
        result = client.cancel(args.ids[0])
    finally:
        client.close()
    _say(args, {"message_id": args.ids[0], "result": result.value},
         result.describe(args.ids[0]))
    return 0


def _cancel(args: argparse.Namespace, run_id: str, task_id: str = "") -> int:
    """Cancel a run, or one task of it (scheduler/cancel.py), and say what happened."""
    config = config_from(args)
    client = Client.from_settings(config.settings)
    store = stores.from_url(config.settings.state_url)
    try:
        if task_id:
            done = cancel.cancel_task(store, run_id, task_id, time.time(), client.cancel)
        else:
            done = cancel.cancel_run(store, run_id, time.time(), client.cancel)
    finally:
        store.close()
        client.close()
    daemons.poke(config, run_id)
    what = f"{task_id} in run {run_id}" if task_id else f"run {run_id}"
    _say(args, {"run_id": run_id, **({"task_id": task_id} if task_id else {}), **done.doc()},
         done.describe(what))
    return 0


def _dag(config: SchedulerConfig, dag_id: str) -> DAG:
    dag = load(config).dags.get(dag_id)
    if dag is None:
        raise ConfigError(f"no DAG {dag_id!r} loads from {config.dags_folder!r}: see "
                          "`conveyor dags list`")
    return dag


def _say(args: argparse.Namespace, doc: dict[str, Any], line: str) -> None:
    print(json.dumps(doc) if args.json else line)
