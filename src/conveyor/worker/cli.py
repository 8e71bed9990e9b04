"""`conveyor worker`: flags (Celery's names where the meaning matches) and start-up.

Every flag has a CONVEYOR_* variable, shown in --help. A bad flag or an unreachable broker
stops the worker at start with one readable line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from conveyor import broker as brokers
from conveyor import limits, results, tracing
from conveyor.config import (
    Renamed,
    Settings,
    env_flag,
    log_level,
    non_negative_int,
    port,
    positive_int,
    positive_seconds,
    seconds,
    size,
    url,
)
from conveyor.errors import ConfigError
from conveyor.limits import Limiter
from conveyor.results.base import ResultStore
from conveyor.worker.isolation import make_non_dumpable, resolve_task_user, scrub_environment
from conveyor.worker.metrics import WorkerMetrics, metrics_for
from conveyor.worker.pool import Zygote, spawn_zygote
from conveyor.worker.registry import Registry, state_url_for
from conveyor.worker.results import ResultKeeper
from conveyor.worker.supervisor import READ_AHEAD, Supervisor, WorkerConfig


def _queues(text: str) -> tuple[str, ...]:
    queues = tuple(q.strip() for q in text.split(",") if q.strip())
    if not queues:
        raise ConfigError("--queues needs at least one queue name, e.g. --queues=default,heavy")
    return queues


def _celery_memory_threshold(raw: str) -> str | None:
    """Why `--max-memory-per-child` refuses a bare number (None: it takes the value)."""
    if raw.strip().isdigit() and int(raw) != 0:
        return ("a bare number is Celery's KiB threshold for replacing a child after a task; "
                "Conveyor's hard cap on each runner is --memory-limit, with a unit, e.g. "
                f"--memory-limit={max(1, int(raw) // 1024)}MiB")
    return None


#: The hard cap was called --max-memory-per-child, Celery's name for something else.
MEMORY_LIMIT_WAS = Renamed("--max-memory-per-child", "CONVEYOR_MAX_MEMORY_PER_CHILD",
                           refuse=_celery_memory_threshold)


def _apps(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("worker", help="consume queues and run each task in an isolated "
                            "runner", description=__doc__)
    env_flag(p, "-Q", "--queues", env="CONVEYOR_QUEUES", default=("default",), kind=_queues,
             help="comma-separated queues, first listed first")
    env_flag(p, "-c", "--concurrency", env="CONVEYOR_CONCURRENCY", default=os.cpu_count() or 2,
             kind=positive_int, help="runner slots (tasks at once)")
    env_flag(p, "-A", "--app", env="CONVEYOR_APP", default=(), kind=_apps,
             help="comma-separated modules that register tasks (imported once, before forking)")
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="", kind=url,
             help="broker URL (default: the embedded SQLite file)")
    env_flag(p, "--state", env="CONVEYOR_STATE_URL", default="", kind=url,
             help="state store the worker registers in, for `conveyor status` (default: "
             "the embedded one when the broker is too, else none)")
    env_flag(p, "--memory-limit", env="CONVEYOR_MEMORY_LIMIT", default=0, kind=size,
             renamed=MEMORY_LIMIT_WAS, help="hard memory cap of each runner (bytes, or a unit: "
             "2GiB; 0: no cap); a task's own memory_limit wins")
    env_flag(p, "--max-tasks-per-child", env="CONVEYOR_MAX_TASKS_PER_CHILD", default=1,
             kind=positive_int, help="tasks a runner runs before it is replaced (1: fresh "
             "runner per task, the safe default)")
    env_flag(p, "--read-ahead", env="CONVEYOR_READ_AHEAD", default=READ_AHEAD,
             kind=non_negative_int,
             help="deliveries a broker that pushes (RabbitMQ) may send beyond the free slots, "
             "so the next tasks are here when a slot frees; each waits behind this worker's "
             "running tasks while another worker may be idle, and its wait counts toward "
             "RabbitMQ's consumer timeout: 0 for tasks of seconds or more (Celery's -O "
             "fair); the other brokers claim only for a free slot")
    env_flag(p, "--time-limit", env="CONVEYOR_TIME_LIMIT", default=0.0, kind=seconds,
             help="hard time limit in seconds: the runner is killed (0: none)")
    env_flag(p, "--soft-time-limit", env="CONVEYOR_SOFT_TIME_LIMIT", default=0.0, kind=seconds,
             help="soft time limit in seconds: SoftTimeLimitExceeded is raised in the task")
    env_flag(p, "--uid", env="CONVEYOR_UID", default=None,
             help="run tasks as this user (name or number; the worker must be root); its "
             "primary group unless --gid is given")
    env_flag(p, "--gid", env="CONVEYOR_GID", default=None,
             help="run tasks as this group (name or number)")
    env_flag(p, "-n", "--hostname", env="CONVEYOR_HOSTNAME", default=socket.gethostname(),
             help="name of this worker in events and logs")
    env_flag(p, "--heartbeat-interval", env="CONVEYOR_HEARTBEAT_INTERVAL", default=10.0,
             kind=positive_seconds, help="seconds between heartbeats (lease renewals, events)")
    env_flag(p, "--drain-timeout", env="CONVEYOR_DRAIN_TIMEOUT", default=30.0, kind=seconds,
             help="seconds running tasks get to finish after SIGTERM; match Kubernetes' "
             "terminationGracePeriodSeconds")
    env_flag(p, "--burst", env="CONVEYOR_BURST", default=False, kind=bool,
             help="drain the queues, then exit")
    env_flag(p, "--metrics-port", env="CONVEYOR_METRICS_PORT", default=0, kind=port,
             help="serve Prometheus /metrics on this port (0: off)")
    env_flag(p, "--max-deliveries", env="CONVEYOR_MAX_DELIVERIES", default=20,
             kind=positive_int, help="deliveries without an outcome (crashes, shutdowns) "
             "before a message is dead-lettered")
    env_flag(p, "--exit-after-outage", env="CONVEYOR_EXIT_AFTER_OUTAGE", default=0.0,
             kind=seconds, help="stop the worker when the broker has been unreachable this "
             "many seconds with outcomes waiting to be settled (0: never; ride out any outage)")
    env_flag(p, "--log-level", env="CONVEYOR_LOG_LEVEL", default="INFO", kind=log_level,
             help="log level")
    env_flag(p, "--celery-queues", env="CONVEYOR_CELERY_QUEUES", default=(), kind=_apps,
             help="comma-separated Celery queues to take tasks from (Celery task protocol 2, "
             "JSON); they run as the tasks registered under the same names")
    env_flag(p, "--celery-broker", env="CONVEYOR_CELERY_BROKER", default="", kind=url,
             help="the broker URL the Celery producers publish to (kombu URL)")
    env_flag(p, "--celery-result-backend", env="CONVEYOR_CELERY_RESULT_BACKEND", default="",
             kind=url,
             help="Celery's Redis result backend: results are written there in Celery's "
             "format (default: Conveyor events only)")
    p.set_defaults(run=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    make_non_dumpable()  # first: a same-uid task must not read this process's environ or memory
    uid, gid = resolve_task_user(args.uid, args.gid)
    _warn_about_shape(uid)
    # the zygote's start-up (imports, warming) overlaps the apps' import and the broker's
    # connection here: it was half of a worker's time to its first task
    zygote = spawn_zygote(args.app, scrub_environment(os.environ), args.max_tasks_per_child,
                          uid, gid)
    try:
        return _run_worker(args, uid, gid, zygote)
    except BaseException:
        zygote.discard()  # stops it unless the pool has (then there is nothing left to do)
        raise


def _run_worker(args: argparse.Namespace, uid: int | None, gid: int | None,
                zygote: Zygote) -> int:
    sys.path.insert(0, os.getcwd())
    for module in args.app:
        _import_app(module)
    settings = Settings.from_env(broker_url=args.broker or None, state_url=args.state or None)
    tracing.configure(settings.tracing, "conveyor-worker")
    intake = _celery_intake(args, settings)
    config = WorkerConfig(
        queues=tuple(dict.fromkeys(args.queues + (intake.config.queues if intake else ()))),
        concurrency=args.concurrency, apps=args.app,
        memory_limit=args.memory_limit,
        max_tasks_per_child=args.max_tasks_per_child, read_ahead=args.read_ahead,
        time_limit=args.time_limit,
        soft_time_limit=args.soft_time_limit, uid=uid, gid=gid,
        hostname=args.hostname, heartbeat_interval=args.heartbeat_interval,
        drain_timeout=args.drain_timeout, burst=args.burst, metrics_port=args.metrics_port,
        max_deliveries=args.max_deliveries, exit_after_outage=args.exit_after_outage)
    broker = brokers.from_url(settings.broker_url,
                              lease_seconds=max(3.0, 3 * config.heartbeat_interval))
    if broker.weaker_guarantees:
        logging.getLogger("conveyor.worker").warning("weaker guarantees: %s",
                                                     broker.weaker_guarantees)
    metrics = metrics_for(config.metrics_port)
    supervisor = Supervisor(config, broker, settings.codec(), metrics,
                            results=_result_keeper(settings), limiter=_limiter(settings),
                            zygote=zygote)
    if isinstance(metrics, WorkerMetrics):
        metrics.serve(config.metrics_port)
    registry = _register(settings, supervisor)
    try:
        return intake.run(supervisor.run) if intake else supervisor.run()
    finally:
        if registry is not None:
            registry.close()


def _result_keeper(settings: Settings) -> ResultKeeper:
    """Results of messages that ask for them; the store is opened on the first one."""
    def open_store() -> ResultStore:
        return results.from_url(results.url_for(settings))
    return ResultKeeper(open_store, settings.result_ttl, settings.result_max_bytes)


def _limiter(settings: Settings) -> Callable[[], Limiter]:
    """Flow control's store, opened on the first limited message (see worker/flow.py)."""
    where = limits.url_for(settings.broker_url, settings.state_url, settings.limits_url)
    return lambda: limits.from_url(where)


def _warn_about_shape(uid: int | None) -> None:
    """Say plainly at start what tasks can reach in this shape (README: Security model)."""
    task_uid = os.geteuid() if uid is None else uid
    if task_uid != os.geteuid():
        return  # the safe shape: tasks under another uid than the worker's
    if task_uid == 0:
        logging.getLogger("conveyor.worker").warning(
            "tasks run as root: nothing of the worker is hidden from them (root may read any "
            "process); give --uid/--gid (e.g. --uid nobody) to run them unprivileged")
    else:
        logging.getLogger("conveyor.worker").warning(
            "tasks run as this worker's uid %d: they cannot read its memory or environment, "
            "but they can signal it; start the worker as root with --uid to separate them",
            os.getuid())


def _register(settings: Settings, supervisor: Supervisor) -> Registry | None:
    """Start this worker's heartbeat row in the state store (see `worker.registry`)."""
    url = state_url_for(settings.broker_url, settings.state_url)
    if url is None:
        logging.getLogger("conveyor.worker").info(
            "not in the worker registry: give --state (CONVEYOR_STATE_URL) to see this "
            "worker in `conveyor status`")
        return None
    c = supervisor.config
    registry = Registry(url, c.hostname, c.queues, c.concurrency, c.heartbeat_interval)
    return registry.start(lambda: len(supervisor.running) + len(supervisor.pending),
                          supervisor.runners)


def _celery_intake(args: argparse.Namespace, settings: Settings) -> Any:
    """The Celery intake if --celery-queues was given (kombu is imported only then)."""
    if not args.celery_queues:
        return None
    from conveyor.celery_intake.intake import Intake, IntakeConfig
    config = IntakeConfig(args.celery_queues, args.celery_broker, settings.broker_url,
                          args.celery_result_backend)
    return Intake(config, settings.codec())


def _import_app(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise ConfigError(f"cannot import --app module {module!r}: "
                          f"{type(exc).__name__}: {exc}") from None
