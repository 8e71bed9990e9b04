"""The `conveyor scheduler` daemon's command, and the flags every scheduler command shares.

The client commands that talk to the scheduler through the state store (`dags`, `submit`,
`runs`) live in `conveyor.cli`; they take `common_flags` and `config_from` from here so a
setting means the same thing to the daemon and to them.
"""

from __future__ import annotations

import argparse
import logging
import signal

from conveyor import tracing
from conveyor.config import (
    env_flag,
    log_level,
    port,
    positive_int,
    positive_seconds,
    seconds,
    url,
)
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler.config import RELOAD_INTERVAL, SchedulerConfig
from conveyor.scheduler.folder import DagFolder, Loaded, load_folder
from conveyor.scheduler.sampler import DEFAULT_INTERVAL
from conveyor.signals import SignalThread
from conveyor.state import store as stores

log = logging.getLogger("conveyor.scheduler")


def common_flags(p: argparse.ArgumentParser, *, dags: bool = True) -> None:
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="", kind=url,
             help="broker URL (default: the embedded SQLite file)")
    env_flag(p, "--state", env="CONVEYOR_STATE_URL", default="", kind=url,
             help="state store URL, sqlite:///… or postgresql://… (default: embedded SQLite)")
    env_flag(p, "--executors", env="CONVEYOR_EXECUTORS", default="queue",
             help="comma-separated executors, the first the default: queue, local, kubernetes")
    if dags:
        env_flag(p, "--dags-folder", env="CONVEYOR_DAGS_FOLDER", default="dags",
                 help="folder of DAG files")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("scheduler", help="run DAGs: dispatch ready tasks, apply their "
                            "events, retry, time out, tick cron schedules",
                            description=daemons.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    common_flags(p)
    env_flag(p, "--burst", env="CONVEYOR_SCHEDULER_BURST", default=False, kind=bool,
             help="exit when no run is queued or running")
    env_flag(p, "--dags-reload-interval", env="CONVEYOR_DAGS_RELOAD_INTERVAL",
             default=RELOAD_INTERVAL, kind=seconds,
             help="seconds between looks at the DAGs folder: added, changed and removed files "
                  "are loaded again without a restart (0: only on SIGHUP)")
    env_flag(p, "--local-slots", env="CONVEYOR_LOCAL_SLOTS", default=4, kind=positive_int,
             help="tasks the local executor runs at once")
    env_flag(p, "--kubernetes-namespace", env="CONVEYOR_KUBERNETES_NAMESPACE",
             default="default", help="namespace of task pods")
    env_flag(p, "--kubernetes-image", env="CONVEYOR_KUBERNETES_IMAGE", default="",
             help="default image of task pods (a task's executor_config may name another)")
    env_flag(p, "--kubernetes-pending-timeout", env="CONVEYOR_KUBERNETES_PENDING_TIMEOUT",
             default=300.0, kind=positive_seconds,
             help="seconds a pod may stay Pending before it fails")
    env_flag(p, "--queue-sample-interval", env="CONVEYOR_QUEUE_SAMPLE_INTERVAL",
             default=DEFAULT_INTERVAL, kind=seconds,
             help="seconds between samples of queue depth, kept a few hours for the "
                  "dashboard's chart (0: none)")
    env_flag(p, "--metrics-port", env="CONVEYOR_SCHEDULER_METRICS_PORT", default=0, kind=port,
             help="serve Prometheus /metrics on this port (0: off)")
    env_flag(p, "--log-level", env="CONVEYOR_LOG_LEVEL", default="INFO", kind=log_level,
             help="log level")
    p.set_defaults(run=run_scheduler)


def config_from(args: argparse.Namespace) -> SchedulerConfig:
    """The settings these flags imply (flags > CONVEYOR_* environment > defaults)."""
    flags = {name: getattr(args, name, None) for name in (
        "dags_folder", "executors", "dags_reload_interval", "local_slots",
        "kubernetes_namespace", "kubernetes_image", "kubernetes_pending_timeout",
        "queue_sample_interval")}
    return SchedulerConfig.from_env(broker_url=args.broker or None,
                                    state_url=args.state or None, **flags)


def run_scheduler(args: argparse.Namespace) -> int:
    config = config_from(args)
    tracing.configure(config.settings.tracing, "conveyor-scheduler")
    folder = DagFolder(config.dags_folder, config.executors,
                       import_timeout=config.dag_import_timeout)
    folder.refresh()
    loaded = folder.loaded()
    for error in loaded.errors:
        log.error("DAG not loaded: %s", error)
    log.info("scheduler starting: %d DAG(s) (%s), executors %s, DAG files looked at %s",
             len(loaded.dags), ", ".join(loaded.dags) or "none", ",".join(config.executors),
             f"every {config.dags_reload_interval:g} s" if config.dags_reload_interval
             else "on SIGHUP only")
    daemon = daemons.build(config, loaded.dags)
    daemon.watch(folder, config.dags_reload_interval)
    if args.metrics_port:
        serve_metrics(daemon, config, args.metrics_port, len(loaded.errors))
    signals = SignalThread({signal.SIGTERM: lambda _: daemon.stop(),
                            signal.SIGINT: lambda _: daemon.stop(),
                            signal.SIGHUP: lambda _: daemon.reload()})
    try:
        daemon.run(burst=args.burst)
    finally:
        signals.close()
        daemon.close()
    return 0


def serve_metrics(daemon: daemons.Daemon, config: SchedulerConfig, port_number: int,
                  load_errors: int) -> None:
    """/metrics on `port_number`, fed by the daemon's and the engine's hooks."""
    from conveyor.scheduler.metrics import SchedulerMetrics
    metrics = SchedulerMetrics(config.settings.state_url or stores.default_url())
    metrics.load_errors.set(load_errors)
    daemon.on_reloaded = metrics.load_errors.set
    daemon.on_applied = metrics.event_lag.observe
    daemon.engine.on_dispatched = metrics.dispatched
    metrics.serve(port_number)
    log.info("metrics on http://0.0.0.0:%d/metrics", port_number)


def load(config: SchedulerConfig) -> Loaded:
    """The DAGs of the configured folder, checked against the configured executors."""
    return load_folder(config.dags_folder, config.executors,
                       import_timeout=config.dag_import_timeout)
