"""`conveyor dags pause|unpause` and `conveyor tasks clear|mark`: operations on DAGs and runs
(the work is in `conveyor.scheduler.operations`; this is flags, output and the poke that
makes a running scheduler act at once)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from conveyor.errors import ConfigError
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler import operations
from conveyor.scheduler.cli import common_flags, config_from, load
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.runs import iso
from conveyor.state import store as stores


def register_dags(dags: argparse._SubParsersAction) -> None:
    for verb, paused in (("pause", True), ("unpause", False)):
        p = dags.add_parser(verb, help="stop starting runs of a DAG (running ones finish)"
                            if paused else "let a paused DAG start runs again")
        p.add_argument("dag", help="DAG id")
        common_flags(p)
        p.set_defaults(run=run_pause, paused=paused)


def register_backfill(dags: argparse._SubParsersAction,
                      date: Callable[[str], float]) -> None:
    p = dags.add_parser("backfill", help="create the runs of a past date range (again: no-op)")
    p.add_argument("dag", help="DAG id (it needs a schedule)")
    p.add_argument("--from", dest="start", type=date, required=True,
                   help="first logical date, ISO-8601 (included)")
    p.add_argument("--to", dest="end", type=date, required=True,
                   help="last logical date, ISO-8601 (included)")
    common_flags(p)
    p.set_defaults(run=run_backfill)


def register_tasks(tasks: argparse._SubParsersAction) -> None:
    p = tasks.add_parser("clear", help="re-run a task instance and everything downstream")
    p.add_argument("run_id", help="run id (from `runs list`)")
    p.add_argument("task_id", help="task id within the run's DAG")
    p.add_argument("--only", action="store_true", help="this task only, not its downstream")
    common_flags(p, dags=False)
    p.set_defaults(run=run_clear)
    p = tasks.add_parser("mark", help="set a task instance's state by hand")
    p.add_argument("run_id", help="run id (from `runs list`)")
    p.add_argument("task_id", help="task id within the run's DAG")
    p.add_argument("mark_as", metavar="STATE", choices=operations.MARKABLE,
                   help="success or failed")
    common_flags(p, dags=False)
    p.set_defaults(run=run_mark)


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
        cleared = operations.clear(store, args.run_id, args.task_id, time.time(),
                                   downstream=not args.only)
    finally:
        store.close()
    daemons.poke(config, args.run_id)
    _say(args, {"run_id": args.run_id, "cleared": cleared},
         f"cleared {', '.join(cleared)} in run {args.run_id}: they run again")
    return 0


def run_mark(args: argparse.Namespace) -> int:
    config = config_from(args)
    store = stores.from_url(config.settings.state_url)
    try:
        before = operations.mark(store, args.run_id, args.task_id, args.mark_as, time.time())
    finally:
        store.close()
    daemons.poke(config, args.run_id)
    _say(args, {"run_id": args.run_id, "task_id": args.task_id, "state": args.mark_as,
                "was": before["state"]},
         f"{args.task_id} in run {args.run_id} marked {args.mark_as} (was {before['state']})")
    return 0


def _dag(config: SchedulerConfig, dag_id: str) -> DAG:
    dag = load(config).dags.get(dag_id)
    if dag is None:
        raise ConfigError(f"no DAG {dag_id!r} loads from {config.dags_folder!r}: see "
                          "`conveyor dags list`")
    return dag


def _say(args: argparse.Namespace, doc: dict[str, Any], line: str) -> None:
    print(json.dumps(doc) if args.json else line)
