"""`conveyor limits list|set|clear`: flow-control limits, their use, and changing them live.

`list` shows every key the limiter's store knows: its limit (the one set here if any, else
the one tasks declare), tokens in use, messages waiting (parked off the queues until the key
has room) and how often a message was denied (parked, or delayed by a rate). `set` changes
a limit at run time, for every worker at once and without a restart: `--max` for a
concurrency key or a pool (`pool:NAME`), `--per-second` and `--burst` for a rate key. It
wins over what tasks declare until `clear`. Waiting messages move on when a token frees or
at the next sweep (a third of a worker's lease).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from conveyor import limits
from conveyor.cli.connections import connection_flags, nothing_yet, settings
from conveyor.cli.output import output
from conveyor.config import checked, env_flag
from conveyor.kinds import positive_int
from conveyor.limits import Limiter, Override


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = commands.add_parser("limits", help="list, set or clear flow-control limits",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = group.add_subparsers(dest="limits_command", required=True)
    listing = verbs.add_parser("list", help="every key: limit, in use, waiting, denied")
    _flags(listing)
    listing.set_defaults(run=run_list)
    change = verbs.add_parser("set", help="override a key's limit at run time")
    change.add_argument("key", help="the key as tasks format it, e.g. tenant:acme, "
                        "partner-api, pool:exports")
    change.add_argument("--max", type=checked(positive_int), default=None,
                        help="tasks of this key at once (slots, for a pool)")
    change.add_argument("--per-second", type=checked(_rate), default=None,
                        help="starts a second, across every worker")
    change.add_argument("--burst", type=checked(positive_int), default=None,
                        help="starts allowed at once after a quiet spell")
    _flags(change)
    change.set_defaults(run=run_set)
    clear = verbs.add_parser("clear", help="drop a key's run-time limit: the declared one "
                             "applies again")
    clear.add_argument("key")
    _flags(clear)
    clear.set_defaults(run=run_clear)


def _rate(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be a number of starts a second above 0")
    return value


def _flags(p: argparse.ArgumentParser) -> None:
    connection_flags(p)
    env_flag(p, env="CONVEYOR_LIMITS_URL")


def _url(args: argparse.Namespace) -> str:
    return replace(settings(args), limits_url=args.limits_url).stores().limits


def _open(args: argparse.Namespace) -> Limiter:
    return limits.from_url(_url(args))


def run_list(args: argparse.Namespace) -> int:
    if nothing_yet(_url(args)):   # reading creates no store: no keys there yet
        usage = []
    else:
        limiter = _open(args)
        try:
            usage = limiter.usage(time.time())
        finally:
            limiter.close()
    rows: list[dict[str, Any]] = [{
        "key": u.key, "limit": u.limit + (" (set)" if u.overridden else ""),
        "in use": u.in_use, "waiting": u.waiting, "denied": u.denied} for u in usage]
    doc = [{"key": u.key, "max": u.max, "per_second": u.per_second, "burst": u.burst,
            "overridden": u.overridden, "in_use": u.in_use, "waiting": u.waiting,
            "denied": u.denied} for u in usage]
    if not rows and not args.json:
        print("no limits yet: keys appear when a limited task is first claimed, or with "
              "`conveyor limits set`")
        return 0
    output(doc, rows, ["key", "limit", "in use", "waiting", "denied"], args.json)
    return 0


def run_set(args: argparse.Namespace) -> int:
    override = Override(args.max, args.per_second, args.burst).checked(args.key)
    limiter = _open(args)
    try:
        limiter.set_limit(args.key, override)
    finally:
        limiter.close()
    print(f"{args.key}: {override.describe()} (every worker, from its next claim)")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    limiter = _open(args)
    try:
        had = limiter.clear(args.key)
    finally:
        limiter.close()
    print(f"{args.key}: run-time limit cleared" if had else
          f"{args.key}: had no run-time limit")
    return 0
