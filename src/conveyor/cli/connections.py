"""What the operator commands share: the broker and state-store flags, and opening them
(which queues are worth looking at is `conveyor.readers.queues`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor import broker as brokers
from conveyor.config import Settings, env_flag, url
from conveyor.state.store import Store


def connection_flags(p: argparse.ArgumentParser, *, state: bool = True) -> None:
    """--broker, --state (optional) and --json, with their CONVEYOR_* variables."""
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="", kind=url,
             help="broker URL (default: the embedded SQLite file)")
    if state:
        env_flag(p, "--state", env="CONVEYOR_STATE_URL", default="", kind=url,
                 help="state store URL, sqlite:///… or postgresql://… (default: embedded "
                      "SQLite)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(broker_url=args.broker or None,
                             state_url=getattr(args, "state", "") or None)


@contextmanager
def opened_broker(args: argparse.Namespace) -> Iterator[brokers.Broker]:
    broker = brokers.from_url(settings(args).broker_url)
    try:
        yield broker
    finally:
        broker.close()


@contextmanager
def opened_store(args: argparse.Namespace) -> Iterator[Store]:
    from conveyor.state import store as stores
    store = stores.from_url(settings(args).state_url)
    try:
        yield store
    finally:
        store.close()
