"""`conveyor autoscaler --config autoscaler.toml`: flags, start-up and signals.

Every flag has a CONVEYOR_* variable, shown in --help; flags and variables override the
file. A bad file or flag stops it at start with one line naming the key.
"""

from __future__ import annotations

import argparse
import logging
import signal
from dataclasses import replace

from conveyor.autoscaler import config as configs
from conveyor.autoscaler import daemon as daemons
from conveyor.config import env_flag
from conveyor.signals import SignalThread

log = logging.getLogger("conveyor.autoscaler")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("autoscaler", help="scale worker Deployments or local workers on "
                            "queue depth, down to zero", description=daemons.__doc__,
                            epilog=configs.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    env_flag(p, env="CONVEYOR_AUTOSCALER_CONFIG")
    env_flag(p, env="CONVEYOR_BROKER_URL")
    env_flag(p, env="CONVEYOR_STATE_URL")
    env_flag(p, env="CONVEYOR_AUTOSCALER_METRICS_PORT")
    env_flag(p, env="CONVEYOR_LOG_LEVEL")
    p.set_defaults(run=run_autoscaler)


def run_autoscaler(args: argparse.Namespace) -> int:
    config = configs.load(args.config)
    if args.broker:
        config = replace(config, broker_url=args.broker)
    if args.state:
        config = replace(config, state_url=args.state)
    if args.metrics_port is not None:
        config = replace(config, metrics_port=args.metrics_port)
    daemon, server = daemons.build(config)

    def on_signal(signum: int) -> None:
        log.info("%s: stopping (local workers drain first)", signal.Signals(signum).name)
        daemon.stop()

    signals = SignalThread({signal.SIGTERM: on_signal, signal.SIGINT: on_signal})
    if server is not None:
        log.info("autoscaler: /metrics and /api/v1/queues/<queue> on port %d", server.port)
    try:
        return daemon.run()
    finally:
        signals.close()
        if server is not None:
            server.close()
