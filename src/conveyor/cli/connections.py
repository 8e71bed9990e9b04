"""What the operator commands share: the broker and state-store flags, and opening them
(which queues are worth looking at is `conveyor.readers.queues`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor import broker as brokers
from conveyor.config import Settings, env_flag
from conveyor.locations import missing_sqlite_file
from conveyor.state.store import Store


def connection_flags(p: argparse.ArgumentParser, *, state: bool = True) -> None:
    """--broker, --state (optional) and --json, with their CONVEYOR_* variables."""
    env_flag(p, env="CONVEYOR_BROKER_URL")
    if state:
        env_flag(p, env="CONVEYOR_STATE_URL")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(broker_url=args.broker or None,
                             state_url=getattr(args, "state", "") or None)


def nothing_yet(url: str) -> str:
    """Why there is nothing to read at `url` yet (an embedded SQLite file nothing has
    written), or "" when there may be: a read-only command says this instead of creating
    the file."""
    missing = missing_sqlite_file(url)
    if missing is None:
        return ""
    return (f"{missing} does not exist: nothing has run with this data directory "
            "($CONVEYOR_HOME, else ~/.local/share/conveyor) and these URLs; `conveyor up`, a "
            "scheduler or a worker creates it")


def state_url(args: argparse.Namespace) -> str:
    """The state store URL the command's flags and environment name (the default spelled
    out)."""
    return settings(args).stores().state


def broker_url(args: argparse.Namespace) -> str:
    return settings(args).stores().broker


@contextmanager
def opened_broker(args: argparse.Namespace) -> Iterator[brokers.Administrator]:
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
