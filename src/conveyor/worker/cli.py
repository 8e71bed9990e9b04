"""`conveyor worker`: flags (Celery's names where the meaning matches) and start-up.

Every flag has a CONVEYOR_* variable, shown in --help. A bad flag or an unreachable broker
stops the worker at start with one readable line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from conveyor import broker as brokers
from conveyor import kinds, limits, results, tracing
from conveyor.broker import Consumer
from conveyor.config import Renamed, Settings, env_flag
from conveyor.control.for_broker import for_broker
from conveyor.control.watch import CancelWatch
from conveyor.errors import ConfigError
from conveyor.limits import Limiter
from conveyor.locations import listening
from conveyor.results.base import ResultStore
from conveyor.worker import cgroups, code_version
from conveyor.worker.apps import dag_files, import_app
from conveyor.worker.arenas import use_one_arena
from conveyor.worker.config import WorkerConfig
from conveyor.worker.flow import Gate
from conveyor.worker.followups import Publisher
from conveyor.worker.isolation import make_non_dumpable, resolve_task_user, scrub_environment
from conveyor.worker.metrics import Metrics, WorkerMetrics, metrics_for
from conveyor.worker.observers import Measured, Observer, Reported, Results, Tracing
from conveyor.worker.pool import Pool
from conveyor.worker.registry import Registry
from conveyor.worker.results import ResultKeeper
from conveyor.worker.spawn import Zygote, spawn_zygote
from conveyor.worker.supervisor import PoolFactory, Supervisor


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


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("worker", help="consume queues and run each task in an isolated "
                            "runner", description=__doc__)
    env_flag(p, env="CONVEYOR_QUEUES")
    env_flag(p, env="CONVEYOR_CONCURRENCY")
    env_flag(p, env="CONVEYOR_APP")
    env_flag(p, env="CONVEYOR_DAGS_FOLDER")
    env_flag(p, env="CONVEYOR_BROKER_URL")
    env_flag(p, env="CONVEYOR_STATE_URL")
    env_flag(p, env="CONVEYOR_MEMORY_LIMIT", renamed=MEMORY_LIMIT_WAS)
    env_flag(p, env="CONVEYOR_MAX_TASKS_PER_CHILD")
    env_flag(p, env="CONVEYOR_READ_AHEAD")
    env_flag(p, env="CONVEYOR_TIME_LIMIT")
    env_flag(p, env="CONVEYOR_SOFT_TIME_LIMIT")
    env_flag(p, env="CONVEYOR_CANCEL_GRACE")
    env_flag(p, env="CONVEYOR_UID")
    env_flag(p, env="CONVEYOR_GID")
    env_flag(p, env="CONVEYOR_HOSTNAME")
    env_flag(p, env="CONVEYOR_CODE_VERSION")
    env_flag(p, env="CONVEYOR_HEARTBEAT_INTERVAL")
    env_flag(p, env="CONVEYOR_LEASE")
    env_flag(p, env="CONVEYOR_DRAIN_TIMEOUT")
    env_flag(p, env="CONVEYOR_BURST")
    env_flag(p, env="CONVEYOR_METRICS_PORT")
    env_flag(p, env="CONVEYOR_MAX_DELIVERIES")
    env_flag(p, env="CONVEYOR_EXIT_AFTER_OUTAGE")
    env_flag(p, env="CONVEYOR_LOG_LEVEL")
    env_flag(p, env="CONVEYOR_CELERY_QUEUES")
    env_flag(p, env="CONVEYOR_CELERY_BROKER")
    env_flag(p, env="CONVEYOR_CELERY_RESULT_BACKEND")
    env_flag(p, env="CONVEYOR_CELERY_CANVAS")
    p.set_defaults(run=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    make_non_dumpable()  # first: a same-uid task must not read this process's environ or memory
    use_one_arena()  # before any thread starts: each would get an arena (worker/arenas.py)
    uid, gid = resolve_task_user(args.uid, args.gid)
    metrics = _served_metrics(args.metrics_port)   # a port in use stops us before anything
    _warn_about_shape(uid)
    # the zygote's start-up (imports, warming) overlaps the apps' import and the broker's
    # connection here: it was half of a worker's time to its first task
    args.app = (*args.app, *dag_files(args.dags_folder))   # TaskFlow tasks of DAG files
    zygote = spawn_zygote(args.app, scrub_environment(os.environ), args.max_tasks_per_child,
                          uid, gid)
    try:
        return _run_worker(args, uid, gid, zygote, metrics)
    except BaseException:
        zygote.discard()  # stops it unless the pool has (then there is nothing left to do)
        raise


def _served_metrics(port_number: int) -> Metrics:
    """The worker's metrics, served on `port_number` from now on (0: none)."""
    metrics = metrics_for(port_number)
    if isinstance(metrics, WorkerMetrics):
        with listening("the worker's /metrics", "0.0.0.0", port_number, "--metrics-port"):
            metrics.serve(port_number)
    return metrics


def _announce_code_version(args: argparse.Namespace) -> str:
    """The version this worker announces and serves `<queue>@<it>` for: the one given
    (--code-version), else the one derived from its app (git revision, source hash); none
    with `--code-version none`, or without an app. On RabbitMQ those queues expire once
    unused (`pinned_queue_expires`), so a version of every build costs nothing lasting."""
    log = logging.getLogger("conveyor.worker")
    version = code_version.announced(str(args.code_version or ""), args.app)
    if version:
        log.info("code version %s (%s; runs pinned to their code can use this worker)",
                 version, "given" if args.code_version else "derived from the app")
    elif args.code_version == code_version.OFF:
        log.info("no code version announced (--code-version none): runs pinned to their "
                 "code do not use this worker")
    return version


def _run_worker(args: argparse.Namespace, uid: int | None, gid: int | None,
                zygote: Zygote, metrics: Metrics) -> int:
    sys.path.insert(0, os.getcwd())
    for app in args.app:
        import_app(app)
    settings = Settings.from_env(broker_url=args.broker or None, state_url=args.state or None)
    tracing.configure(settings.tracing, "conveyor-worker")
    intake = _celery_intake(args, settings)
    version = _announce_code_version(args)
    pinned = [kinds.pinned_queue(q, version) for q in args.queues] if version else []
    config = WorkerConfig(
        queues=tuple(dict.fromkeys(pinned + [*args.queues,
                                             *(intake.config.queues if intake else ())])),
        code_version=version,
        concurrency=args.concurrency, apps=args.app,
        memory_limit=args.memory_limit,
        max_tasks_per_child=args.max_tasks_per_child, read_ahead=args.read_ahead,
        time_limit=args.time_limit,
        soft_time_limit=args.soft_time_limit, cancel_grace=args.cancel_grace, uid=uid, gid=gid,
        hostname=args.hostname, heartbeat_interval=args.heartbeat_interval,
        drain_timeout=args.drain_timeout, burst=args.burst, metrics_port=args.metrics_port,
        max_deliveries=args.max_deliveries, exit_after_outage=args.exit_after_outage)
    broker = brokers.from_url(settings.broker_url, lease_seconds=lease_seconds(args))
    if broker.weaker_guarantees:
        logging.getLogger("conveyor.worker").warning("weaker guarantees: %s",
                                                     broker.weaker_guarantees)
    followups = _followups(settings, metrics)
    caps = cgroups.detect()  # the worker moves into a cgroup of its own here (cgroups/v2.py)
    codec = settings.codec()
    supervisor = Supervisor(config, broker, codec, pool=_pool(config, caps, zygote, followups),
                            caps=caps, followups=followups,
                            observers=_observers(config, broker, settings, metrics),
                            gate=Gate(_limiter(settings), broker, codec, metrics.limit_denied,
                                      metrics.limits if metrics.wants_limits else None),
                            cancels=_cancel_watch(settings))
    registry = _register(settings, supervisor)
    try:
        return intake.run(supervisor.run) if intake else supervisor.run()
    finally:
        if registry is not None:
            registry.close()


def lease_seconds(args: argparse.Namespace) -> float:
    """`--lease`, else three heartbeat intervals and at least 3 s; it must outlast two
    intervals, or a lease would lapse between two renewals (worker/fencing.py)."""
    if not args.lease:
        return max(3.0, 3.0 * float(args.heartbeat_interval))
    if args.lease < 2 * args.heartbeat_interval:
        raise ConfigError(f"--lease={args.lease:g} is shorter than two heartbeat intervals "
                          f"(--heartbeat-interval={args.heartbeat_interval:g}): leases are "
                          "renewed once an interval; give a longer lease or beat more often")
    return float(args.lease)


def _pool(config: WorkerConfig, caps: cgroups.MemoryCaps, zygote: Zygote,
          followups: Publisher) -> PoolFactory:
    """The runner pool: `zygote`'s lanes, one per slot, capped by `caps`; what tasks
    enqueue goes to `followups`."""
    def build(on_change: Callable[[], None]) -> Pool:
        return Pool(list(config.apps), scrub_environment(os.environ), on_change, caps,
                    config.max_tasks_per_child, config.uid, config.gid,
                    lanes=config.concurrency, zygote=zygote, on_request=followups.submit)
    return build


def _observers(config: WorkerConfig, broker: Consumer, settings: Settings,
               metrics: Metrics) -> list[Observer]:
    """What follows each task's life besides the supervisor (worker/observers.py)."""
    return [Tracing(config.hostname), Results(_result_keeper(settings)), Measured(metrics),
            Reported(broker, config.hostname, config.code_version)]


def _result_keeper(settings: Settings) -> ResultKeeper:
    """Results of messages that ask for them; the store is opened on the first one."""
    def open_store() -> ResultStore:
        return results.from_url(settings.stores().results)
    return ResultKeeper(open_store, settings.result_ttl, settings.result_max_bytes)


def _followups(settings: Settings, metrics: Metrics) -> Publisher:
    """What tasks enqueue, published on a connection of its own to this worker's broker,
    opened on the first follow-up (see worker/followups.py)."""
    return Publisher(lambda: brokers.from_url(settings.broker_url), settings.codec(),
                     metrics, open_limiter=_limiter(settings))


def _limiter(settings: Settings) -> Callable[[], Limiter]:
    """Flow control's store, opened on the first limited message (see worker/flow.py)."""
    where = settings.stores().limits
    return lambda: limits.from_url(where)


def _cancel_watch(settings: Settings) -> CancelWatch:
    """What was cancelled, read from flow control's store and heard on the control channel
    (conveyor/control); started by the supervisor."""
    open_records = _limiter(settings)
    return CancelWatch(for_broker(settings.broker_url, open_records), open_records)


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
    url = settings.stores().registry
    if url is None:
        logging.getLogger("conveyor.worker").info(
            "not in the worker registry: give --state (CONVEYOR_STATE_URL) to see this "
            "worker in `conveyor status`")
        return None
    c = supervisor.config
    pinned = {kinds.pinned_queue(q, c.code_version) for q in c.queues} if c.code_version else set()
    served = [q for q in c.queues if q not in pinned]
    registry = Registry(url, c.hostname, served, c.concurrency, c.heartbeat_interval,
                        code_version=c.code_version)
    return registry.start(lambda: len(supervisor.running) + len(supervisor.pending),
                          supervisor.runners)


def _celery_intake(args: argparse.Namespace, settings: Settings) -> Any:
    """The Celery intake if --celery-queues was given (kombu is imported only then)."""
    if not args.celery_queues:
        return None
    from conveyor.celery_intake.intake import Intake, IntakeConfig
    config = IntakeConfig(args.celery_queues, args.celery_broker, settings.broker_url,
                          args.celery_result_backend, canvas=args.celery_canvas)
    return Intake(config, settings.codec(), settings=settings)
