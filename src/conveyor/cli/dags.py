"""`conveyor dags list|trigger` and `conveyor submit`: runs created from the command line.

Both only write the run to the state store and poke the schedulers through the broker; a
running `conveyor scheduler` starts it (or the next one to start does). With `--wait` they
follow the run to its end and print it as `conveyor runs show` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from conveyor.cli import operations
from conveyor.cli.connections import nothing_yet
from conveyor.cli.output import json_argument, table
from conveyor.cli.runs import show_run
from conveyor.config import checked
from conveyor.errors import ConfigError
from conveyor.kinds import non_negative_int, seconds, size
from conveyor.readers.dags import dag_row, dag_rows, load_errors
from conveyor.readers.runs import DONE, run_doc
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler.cli import common_flags, config_from, load
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.runs import trigger
from conveyor.state import store as stores

SUBMIT_DAG = "_submit"


#: A bare date (2026-11-07) as an ISO-8601 string: as the end of a range it is the whole day.
BARE_DATE = 10


def _date(text: str) -> float:
    """An ISO-8601 date or time as Unix seconds; without a time zone it is UTC (as logical
    dates are printed)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 date, e.g. 2026-11-23 "
                                         "or 2026-11-23T03:00:00Z") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _last_date(text: str) -> float:
    """The end of a range, included: a bare date means the whole day (its last instant),
    so `--to 2026-11-07` takes the 7th's 03:00 tick."""
    start = _date(text)
    return start + 86400 - 1e-6 if len(text) == BARE_DATE else start


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dags = commands.add_parser("dags", help="list and trigger DAGs").add_subparsers(
        dest="dags_command", required=True)
    listing = dags.add_parser("list", help="DAGs in the folder, their schedule and last run")
    common_flags(listing)
    listing.set_defaults(run=run_dags_list)
    trig = dags.add_parser("trigger", help="create a run of a DAG now")
    trig.add_argument("dag", help="DAG id")
    trig.add_argument("--conf", type=json_argument(dict), default={}, help="run conf, a JSON "
                      "object (sent to tasks in the 'conf' header)")
    trig.add_argument("--logical-date", type=_date, default=None, help="ISO date (default: now)")
    trig.add_argument("--pin-code", action="store_true", default=None,
                      help="pin this run to its code: its later tasks go only to workers of "
                           "the code version its first task started on (default: the DAG's "
                           "pin_code)")
    _wait_flags(trig)
    common_flags(trig)
    trig.set_defaults(run=run_dags_trigger)
    operations.register_dags(dags)
    operations.register_backfill(dags, _date, _last_date)
    _register_submit(commands)


def _register_submit(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("submit", help="run one task as a one-task run (with the "
                            "scheduler's retries and timeouts)")
    p.add_argument("task", help="registered task name, or with --command the task id")
    p.add_argument("--command", nargs=argparse.REMAINDER, default=None,
                   help="run this program and its arguments instead of a registered task")
    p.add_argument("--args", type=json_argument(list), default=[], help="JSON list")
    p.add_argument("--kwargs", type=json_argument(dict), default={}, help="JSON object")
    p.add_argument("-Q", "--queue", default=None, help="queue (default: the task's)")
    p.add_argument("--executor", default=None, help="executor (default: the first configured)")
    p.add_argument("--retries", type=checked(non_negative_int), default=None,
                   help="retries after a failure")
    p.add_argument("--retry-delay", type=checked(seconds), default=None,
                   help="first retry delay, seconds")
    p.add_argument("--time-limit", type=checked(seconds), default=None, help="seconds")
    p.add_argument("--memory-limit", type=checked(size), default=None, help="e.g. 512MiB")
    p.add_argument("--priority", type=checked(non_negative_int), default=None)
    _wait_flags(p)
    common_flags(p, dags=False)
    p.set_defaults(run=run_submit)


def _wait_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="wait for the run to end; exit 0 on "
                   "success, 1 on failure (or if it was cancelled)")
    p.add_argument("--timeout", type=checked(seconds), default=0.0, help="give up waiting after S "
                   "seconds (0: never)")


def run_dags_list(args: argparse.Namespace) -> int:
    config = config_from(args)
    loaded = load(config)
    if nothing_yet(config.settings.stores().state):
        rows = [dag_row(dag, None, None) for dag in loaded.dags.values()]  # creates no store
    else:
        store = stores.from_url(config.settings.state_url)
        try:
            rows = dag_rows(loaded, store)
        finally:
            store.close()
    errors = load_errors(loaded)
    if args.json:
        print(json.dumps({"dags": rows, "errors": errors}, indent=2))
    else:
        print(table(rows, ["dag_id", "schedule", "tasks", "version", "next_run", "last_run",
                           "last_state", "paused", "file"]))
        for error in loaded.errors:
            print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


def run_dags_trigger(args: argparse.Namespace) -> int:
    config = config_from(args)
    loaded = load(config)
    dag = loaded.dags.get(args.dag)
    if dag is None:
        problems = [str(e) for e in loaded.errors]
        raise ConfigError(f"no DAG {args.dag!r} in {config.dags_folder!r} (loaded: "
                          f"{', '.join(loaded.dags) or 'none'})"
                          + "".join(f"\n  {p}" for p in problems))
    return _start(config, dag, args, conf=args.conf, logical_date=args.logical_date,
                  run_type="manual", pin_code=args.pin_code)


def run_submit(args: argparse.Namespace) -> int:
    config = config_from(args)
    options = {k: v for k, v in {
        "queue": args.queue, "executor": args.executor, "retries": args.retries,
        "retry_delay": args.retry_delay, "time_limit": args.time_limit,
        "memory_limit": args.memory_limit, "priority": args.priority}.items() if v is not None}
    dag = DAG(SUBMIT_DAG, description="one-task runs from `conveyor submit`")
    if args.command is not None:
        dag.command(args.task, args.command, **options)
    else:
        dag.task(args.task, args=args.args, kwargs=args.kwargs, **options)
    dag.validate(config.executors)
    dag.version = "submit"
    return _start(config, dag, args, run_type="submit")


def _start(config: SchedulerConfig, dag: DAG, args: argparse.Namespace,
           **how: Any) -> int:
    store = stores.from_url(config.settings.state_url)
    try:
        run_id = trigger(store, dag, time.time(), executors=config.executors, **how)
        daemons.poke(config, run_id)
        if not args.wait:
            _print_run_id(run_id, dag.dag_id, args.json)
            return 0
        run = _wait(store, run_id, args.timeout)
        show_run(store, run_id, args.json)
        return 0 if run["state"] == "success" else 1
    finally:
        store.close()


def _print_run_id(run_id: str, dag_id: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"run_id": run_id, "dag_id": dag_id, "state": "queued"}))
    else:
        print(f"run {run_id} of {dag_id} queued: conveyor runs show {run_id}")


def _wait(store: stores.Store, run_id: str, timeout: float) -> dict[str, Any]:
    """Wait for the run to end (a client-side wait: it reads the store every 100 ms)."""
    deadline = time.monotonic() + timeout if timeout else float("inf")
    while True:
        run = run_doc(store, run_id)
        if run is not None and run["state"] in DONE:
            return run
        if time.monotonic() > deadline:
            raise RunError(f"run {run_id} did not end within {timeout:g} s (state "
                           f"{run['state'] if run else '?'}): is `conveyor scheduler` running, "
                           "with workers on the run's queues?")
        time.sleep(0.1)
