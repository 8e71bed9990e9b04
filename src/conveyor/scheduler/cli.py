"""The scheduler's commands: `scheduler`, `dags list|trigger`, `runs show`, `submit`.

Each prints a readable table for people, or with `--json` one JSON document for scripts.
Every flag has a CONVEYOR_* variable, shown in --help. `dags trigger` and `submit` only
write the run to the state store and poke the schedulers through the broker; a running
`conveyor scheduler` starts it (or the next one to start does).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.config import env_flag, parse_size
from conveyor.enqueue import _json as json_argument
from conveyor.errors import ConfigError
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler import store as stores
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import RunError
from conveyor.scheduler.loader import Loaded, load_folder
from conveyor.scheduler.runs import iso, trigger

log = logging.getLogger("conveyor.scheduler")
DONE = ("success", "failed")
SUBMIT_DAG = "_submit"


def _date(text: str) -> float:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 date, e.g. "
                                         "2026-11-23T03:00:00Z") from None


def _common(p: argparse.ArgumentParser, *, dags: bool = True) -> None:
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="",
             help="broker URL (default: the embedded SQLite file)")
    env_flag(p, "--state", env="CONVEYOR_STATE_URL", default="",
             help="state store URL, sqlite:///… or postgresql://… (default: embedded SQLite)")
    env_flag(p, "--executors", env="CONVEYOR_EXECUTORS", default="queue",
             help="comma-separated executors, the first the default: queue, local, kubernetes")
    if dags:
        env_flag(p, "--dags-folder", env="CONVEYOR_DAGS_FOLDER", default="dags",
                 help="folder of DAG files")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def register(commands: argparse._SubParsersAction) -> None:
    """Add the scheduler's sub-commands to the `conveyor` parser."""
    _register_scheduler(commands)
    dags = commands.add_parser("dags", help="list and trigger DAGs").add_subparsers(
        dest="dags_command", required=True)
    listing = dags.add_parser("list", help="DAGs in the folder, their schedule and last run")
    _common(listing)
    listing.set_defaults(run=run_dags_list)
    trig = dags.add_parser("trigger", help="create a run of a DAG now")
    trig.add_argument("dag", help="DAG id")
    trig.add_argument("--conf", type=json_argument(dict), default={}, help="run conf, a JSON "
                      "object (sent to tasks in the 'conf' header)")
    trig.add_argument("--logical-date", type=_date, default=None, help="ISO date (default: now)")
    _wait_flags(trig)
    _common(trig)
    trig.set_defaults(run=run_dags_trigger)
    runs = commands.add_parser("runs", help="inspect runs").add_subparsers(
        dest="runs_command", required=True)
    show = runs.add_parser("show", help="each task's state, attempts, timings and error")
    show.add_argument("run_id", help="run id (printed by trigger and submit)")
    _common(show, dags=False)
    show.set_defaults(run=run_runs_show)
    _register_submit(commands)


def _register_scheduler(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("scheduler", help="run DAGs: dispatch ready tasks, apply their "
                            "events, retry, time out, tick cron schedules",
                            description=daemons.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    env_flag(p, "--burst", env="CONVEYOR_SCHEDULER_BURST", default=False, kind=bool,
             help="exit when no run is queued or running")
    env_flag(p, "--local-slots", env="CONVEYOR_LOCAL_SLOTS", default=4, kind=int,
             help="tasks the local executor runs at once")
    env_flag(p, "--kubernetes-namespace", env="CONVEYOR_KUBERNETES_NAMESPACE",
             default="default", help="namespace of task pods")
    env_flag(p, "--kubernetes-image", env="CONVEYOR_KUBERNETES_IMAGE", default="",
             help="default image of task pods (a task's executor_config may name another)")
    env_flag(p, "--kubernetes-pending-timeout", env="CONVEYOR_KUBERNETES_PENDING_TIMEOUT",
             default=300.0, kind=float, help="seconds a pod may stay Pending before it fails")
    env_flag(p, "--log-level", env="CONVEYOR_LOG_LEVEL", default="INFO", help="log level")
    p.set_defaults(run=run_scheduler)


def _register_submit(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("submit", help="run one task as a one-task run (with the "
                            "scheduler's retries and timeouts)")
    p.add_argument("task", help="registered task name, or with --command the task id")
    p.add_argument("--command", nargs=argparse.REMAINDER, default=None,
                   help="run this program and its arguments instead of a registered task")
    p.add_argument("--args", type=json_argument(list), default=[], help="JSON list")
    p.add_argument("--kwargs", type=json_argument(dict), default={}, help="JSON object")
    p.add_argument("-Q", "--queue", default=None, help="queue (default: the task's)")
    p.add_argument("--executor", default=None, help="executor (default: the first configured)")
    p.add_argument("--retries", type=int, default=None, help="retries after a failure")
    p.add_argument("--retry-delay", type=float, default=None, help="first retry delay, seconds")
    p.add_argument("--time-limit", type=float, default=None, help="seconds")
    p.add_argument("--memory-limit", type=parse_size, default=None, help="e.g. 512MiB")
    p.add_argument("--priority", type=int, default=None)
    _wait_flags(p)
    _common(p, dags=False)
    p.set_defaults(run=run_submit)


def _wait_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true", help="wait for the run to end; exit 0 on "
                   "success, 1 on failure")
    p.add_argument("--timeout", type=float, default=0.0, help="give up waiting after S "
                   "seconds (0: never)")


def config_from(args: argparse.Namespace) -> SchedulerConfig:
    """The settings these flags imply (flags > CONVEYOR_* environment > defaults)."""
    flags = {name: getattr(args, name, None) for name in (
        "dags_folder", "executors", "local_slots", "kubernetes_namespace", "kubernetes_image",
        "kubernetes_pending_timeout")}
    return SchedulerConfig.from_env(broker_url=args.broker or None,
                                    state_url=args.state or None, **flags)


# -- scheduler ---------------------------------------------------------------------------------

def run_scheduler(args: argparse.Namespace) -> int:
    config = config_from(args)
    loaded = _load(config)
    for error in loaded.errors:
        log.error("DAG not loaded: %s", error)
    log.info("scheduler starting: %d DAG(s) (%s), executors %s", len(loaded.dags),
             ", ".join(loaded.dags) or "none", ",".join(config.executors))
    daemon = daemons.build(config, loaded.dags)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: daemon.stop())
    try:
        daemon.run(burst=args.burst)
    finally:
        daemon.close()
    return 0


def _load(config: SchedulerConfig) -> Loaded:
    return load_folder(config.dags_folder, config.executors)


# -- dags ----------------------------------------------------------------------------------------

def run_dags_list(args: argparse.Namespace) -> int:
    config = config_from(args)
    loaded = _load(config)
    store = stores.from_url(config.settings.state_url)
    try:
        known = {row["dag_id"]: row for row in store.rows("dags")}
        last = {row["dag_id"]: row for row in store.rows("last_runs")}
    finally:
        store.close()
    rows = [_dag_row(dag, known.get(dag.dag_id), last.get(dag.dag_id))
            for dag in loaded.dags.values()]
    errors = [{"file": e.location.file if e.location else "", "line": e.location.line
               if e.location else 0, "error": str(e)} for e in loaded.errors]
    if args.json:
        print(json.dumps({"dags": rows, "errors": errors}, indent=2))
    else:
        print(table(rows, ["dag_id", "schedule", "tasks", "version", "next_run", "last_run",
                           "last_state", "file"]))
        for error in loaded.errors:
            print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


def _dag_row(dag: DAG, known: dict[str, Any] | None, last: dict[str, Any] | None) -> dict[str, Any]:
    return {"dag_id": dag.dag_id, "schedule": dag.schedule or "", "tasks": len(dag.tasks),
            "version": dag.version, "file": dag.file,
            "next_run": iso(known["next_tick"]) if known and known["next_tick"] else "",
            "last_run": last["run_id"] if last else "",
            "last_state": last["state"] if last else ""}


def run_dags_trigger(args: argparse.Namespace) -> int:
    config = config_from(args)
    loaded = _load(config)
    dag = loaded.dags.get(args.dag)
    if dag is None:
        problems = [str(e) for e in loaded.errors]
        raise ConfigError(f"no DAG {args.dag!r} in {config.dags_folder!r} (loaded: "
                          f"{', '.join(loaded.dags) or 'none'})"
                          + "".join(f"\n  {p}" for p in problems))
    return _start(config, dag, args, conf=args.conf, logical_date=args.logical_date,
                  run_type="manual")


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
        _show(store, run_id, args.json)
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
        run = store.one("run", run_id=run_id)
        if run is not None and run["state"] in DONE:
            return run
        if time.monotonic() > deadline:
            raise RunError(f"run {run_id} did not end within {timeout:g} s (state "
                           f"{run['state'] if run else '?'}): is `conveyor scheduler` running, "
                           "with workers on the run's queues?")
        time.sleep(0.1)


# -- runs ----------------------------------------------------------------------------------------

def run_runs_show(args: argparse.Namespace) -> int:
    config = config_from(args)
    store = stores.from_url(config.settings.state_url)
    try:
        return _show(store, args.run_id, args.json)
    finally:
        store.close()


def _show(store: stores.Store, run_id: str, as_json: bool) -> int:
    run = store.one("run", run_id=run_id)
    if run is None:
        raise RunError(f"no run {run_id!r} in the state store: check the id and --state")
    tasks = store.rows("run_tis", run_id=run_id)
    attempts = store.rows("run_attempts", run_id=run_id)
    if as_json:
        print(json.dumps({"run": run, "tasks": [_task_doc(t) for t in tasks],
                          "attempts": attempts}, indent=2))
        return 0
    took = f" in {run['ended_at'] - run['started_at']:.2f} s" \
        if run["ended_at"] and run["started_at"] else ""
    print(f"run {run['run_id']} of {run['dag_id']} (version {run['dag_version']}, "
          f"{run['run_type']}): {run['state']}{took}")
    print(f"logical date {iso(run['logical_date'])}, created {iso(run['created_at'])}\n")
    print(table([_task_line(t) for t in tasks], ["task", "state", "attempt", "executor",
                                                  "queue", "started", "took", "host",
                                                  "error"]))
    retried = [a for a in attempts if a["outcome"] != "succeeded"]
    if retried:
        names = {t["ti_id"]: t["task_id"] for t in tasks}
        print("\nfailed attempts:")
        for a in retried:
            print(f"  {names[a['ti_id']]} #{a['attempt']} {iso(a['ended_at'])}: "
                  f"{(a['error'] or '').splitlines()[0] if a['error'] else a['outcome']}")
    return 0


def _task_doc(ti: dict[str, Any]) -> dict[str, Any]:
    return {**ti, "spec": json.loads(ti["spec"])}


def _task_line(ti: dict[str, Any]) -> dict[str, Any]:
    took = ti["ended_at"] - ti["started_at"] if ti["ended_at"] and ti["started_at"] else None
    return {"task": ti["task_id"], "state": ti["state"],
            "attempt": f"{ti['attempt']}/{ti['max_attempts']}", "executor": ti["executor"],
            "queue": ti["queue"], "started": iso(ti["started_at"])[11:23],
            "took": f"{took:.3f}s" if took is not None else "", "host": ti["hostname"] or "",
            "error": (ti["error"] or "").split("\n", 1)[0][:80]}


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns under upper-case headers."""
    cells = [[c.upper() for c in columns]] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)

