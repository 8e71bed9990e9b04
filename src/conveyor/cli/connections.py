"""What the operator commands share: the broker and state-store flags, opening them, and the
queues worth looking at."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from conveyor import broker as brokers
from conveyor.celery_intake.names import rejects_of
from conveyor.config import Settings, env_flag, url
from conveyor.scheduler.config import CONTROL_QUEUE
from conveyor.scheduler.engine import EVENTS_QUEUE
from conveyor.state.store import Store

#: Queues always worth showing: the usual work queue and the scheduler's own.
ALWAYS = ("default", EVENTS_QUEUE, CONTROL_QUEUE)
#: How many recent runs name the queues `known_queues` finds.
RECENT = 200


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


def known_queues(store: Store | None, extra: Sequence[str] = ()) -> list[str]:
    """Queues named by flags, registered workers and recent runs, plus the usual ones.

    Brokers cannot list their queues portably, so status and dead-letter commands look at
    the queues someone uses; `--queue` adds any other. A worker with `--celery-queues`
    registers the intake queues, which bring their rejected queues (while it runs).
    """
    found = [*extra, *ALWAYS]
    if store is not None:
        for row in store.rows("workers"):
            found += row["queues"].split(",")
        found += [row["queue"] for row in store.rows("queues_in_use", limit=RECENT)]
    return list(dict.fromkeys(q for q in _with_rejects(found) if q))


def _with_rejects(queues: Sequence[str]) -> list[str]:
    """Each queue, followed by the Celery intake's rejected queue when it is an intake queue:
    the messages the intake could not run are dead letters there, and nobody should have to
    know that queue's name to see them."""
    found: list[str] = []
    for queue in queues:
        rejects = rejects_of(queue)
        found += [queue, rejects] if rejects else [queue]
    return found

