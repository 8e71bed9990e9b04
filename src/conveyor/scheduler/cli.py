"""The `conveyor scheduler` daemon's command, and the flags every scheduler command shares.

The client commands that talk to the scheduler through the state store (`dags`, `submit`,
`runs`) live in `conveyor.cli`; they take `common_flags` and `config_from` from here so a
setting means the same thing to the daemon and to them.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import TYPE_CHECKING

from conveyor import tracing
from conveyor.config import env_flag
from conveyor.locations import listening
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.folder import DagFolder, Loaded, load_folder
from conveyor.signals import SignalThread

if TYPE_CHECKING:
    from conveyor.scheduler.metrics import SchedulerMetrics

log = logging.getLogger("conveyor.scheduler")


#: What every command that reads DAG files says of its --dags-folder.
DAGS_FOLDER_HELP = ("folder of DAG files (default: ./dags, else the folder `conveyor up` runs "
                    "with this data directory)")


def common_flags(p: argparse.ArgumentParser, *, dags: bool = True) -> None:
    env_flag(p, env="CONVEYOR_BROKER_URL")
    env_flag(p, env="CONVEYOR_STATE_URL")
    env_flag(p, env="CONVEYOR_EXECUTORS")
    if dags:
        env_flag(p, env="CONVEYOR_DAGS_FOLDER")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("scheduler", help="run DAGs: dispatch ready tasks, apply their "
                            "events, retry, time out, tick cron schedules",
                            description=daemons.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    common_flags(p)
    env_flag(p, env="CONVEYOR_SCHEDULER_BURST")
    env_flag(p, env="CONVEYOR_DAGS_RELOAD_INTERVAL")
    env_flag(p, env="CONVEYOR_LOCAL_SLOTS")
    env_flag(p, env="CONVEYOR_KUBERNETES_NAMESPACE")
    env_flag(p, env="CONVEYOR_KUBERNETES_IMAGE")
    env_flag(p, env="CONVEYOR_KUBERNETES_PENDING_TIMEOUT")
    env_flag(p, env="CONVEYOR_QUEUE_SAMPLE_INTERVAL")
    env_flag(p, env="CONVEYOR_SCHEDULER_METRICS_PORT")
    env_flag(p, env="CONVEYOR_LOG_LEVEL")
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
    metrics = served_metrics(config, args.metrics_port)  # a port in use stops us first
    tracing.configure(config.settings.tracing, "conveyor-scheduler")
    folder = DagFolder(config.dags_folder, config.executors,
                       import_timeout=config.dag_import_timeout)
    folder.refresh()
    loaded = folder.loaded()
    for error in loaded.errors:
        log.error("DAG not loaded: %s", error)
    log.info("scheduler starting: %d DAG(s) (%s) from %s, executors %s, DAG files looked "
             "at %s", len(loaded.dags), ", ".join(loaded.dags) or "none",
             folder.root, ",".join(config.executors),
             f"every {config.dags_reload_interval:g} s" if config.dags_reload_interval
             else "on SIGHUP only")
    daemon = daemons.build(config, loaded.dags)
    daemon.watch(folder, config.dags_reload_interval)
    if metrics is not None:
        feed_metrics(metrics, daemon, len(loaded.errors))
    signals = SignalThread({signal.SIGTERM: lambda _: daemon.stop(),
                            signal.SIGINT: lambda _: daemon.stop(),
                            signal.SIGHUP: lambda _: daemon.reload()})
    try:
        daemon.run(burst=args.burst)
    finally:
        signals.close()
        daemon.close()
    return 0


def served_metrics(config: SchedulerConfig, port_number: int) -> SchedulerMetrics | None:
    """/metrics on `port_number` (None for 0), fed once the daemon exists (`feed_metrics`)."""
    if not port_number:
        return None
    from conveyor.scheduler.metrics import SchedulerMetrics
    metrics = SchedulerMetrics(config.settings.stores().state)
    with listening("the scheduler's /metrics", "0.0.0.0", port_number, "--metrics-port"):
        metrics.serve(port_number)
    log.info("metrics on http://0.0.0.0:%d/metrics", port_number)
    return metrics


def feed_metrics(metrics: SchedulerMetrics, daemon: daemons.Daemon, load_errors: int) -> None:
    """Hook the metrics to the daemon's and the engine's events."""
    metrics.load_errors.set(load_errors)
    daemon.on_reloaded = metrics.load_errors.set
    daemon.on_applied = metrics.event_lag.observe
    daemon.engine.on_dispatched = metrics.dispatched


def load(config: SchedulerConfig) -> Loaded:
    """The DAGs of the configured folder, checked against the configured executors."""
    return load_folder(config.dags_folder, config.executors,
                       import_timeout=config.dag_import_timeout)
