"""The `conveyor triggerer` daemon's command (see daemon.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from typing import Any

from conveyor.config import env_flag
from conveyor.scheduler.cli import common_flags, config_from
from conveyor.triggerer import daemon as daemons

log = logging.getLogger("conveyor.triggerer")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("triggerer", help="run the triggers of deferred DAG tasks "
                            "(conveyor.Defer): waits that hold no worker slot",
                            description=daemons.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    common_flags(p, dags=False)
    env_flag(p, env="CONVEYOR_TRIGGERER_LEASE")
    env_flag(p, env="CONVEYOR_TRIGGERER_POLL")
    env_flag(p, env="CONVEYOR_TRIGGERER_CAPACITY")
    env_flag(p, env="CONVEYOR_LOG_LEVEL")
    p.set_defaults(run=run_triggerer)


def run_triggerer(args: argparse.Namespace) -> int:
    from conveyor import broker as brokers
    from conveyor.state import store as stores
    config = config_from(args)
    store = stores.from_url(config.settings.stores().state)
    broker: Any = None
    poke = json.dumps({"run_id": ""}).encode()

    def wake() -> None:
        """Wake the schedulers (their control queue), as `dags trigger` does."""
        nonlocal broker
        try:
            if broker is None:
                broker = brokers.from_url(config.settings.broker_url)
            broker.publish(config.control_queue, poke)
        except Exception as exc:  # noqa: BLE001 - the scheduler's next tick finds it anyway
            log.warning("could not wake the scheduler (%s): it resumes the task at its "
                        "next tick", exc)
            broker = None

    triggerer = daemons.Triggerer(store, wake, lease=args.lease, poll=args.poll,
                                  capacity=args.capacity)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, triggerer.stop)
        await triggerer.run()

    try:
        asyncio.run(main())
    finally:
        if broker is not None:
            broker.close()
        store.close()
    return 0
