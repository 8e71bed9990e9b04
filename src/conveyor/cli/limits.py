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
from typing import Any

from conveyor import limits
from conveyor.cli.connections import connection_flags, settings
from conveyor.cli.output import output
from conveyor.config import checked, env_flag, positive_int, url
from conveyor.errors import ConfigError
from conveyor.limits import Limiter, Override


def register(commands: argparse._SubParsersAction) -> None:
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
    env_flag(p, "--limits-url", env="CONVEYOR_LIMITS_URL", default="", kind=url,
             help="where limits are kept (default: the broker unless it is RabbitMQ or "
             "kombu, then the state store)")


def _open(args: argparse.Namespace) -> Limiter:
    s = settings(args)
    return limits.from_url(limits.url_for(s.broker_url, s.state_url, args.limits_url))


def run_list(args: argparse.Namespace) -> int:
    limiter = _open(args)
    try:
        usage = limiter.usage(time.time())
    finally:
        limiter.close()
    rows: list[dict[str, Any]] = [{
        "key": u.key, "limit": _limit_text(u.max, u.per_second, u.burst)
        + (" (set)" if u.overridden else ""),
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


def _limit_text(mx: int | None, per_second: float | None, burst: int | None) -> str:
    parts = []
    if mx is not None:
        parts.append(f"max {mx}")
    if per_second is not None:
        parts.append(f"{per_second:g}/s" + (f" burst {burst}" if burst and burst > 1 else ""))
    return ", ".join(parts) or "-"


def run_set(args: argparse.Namespace) -> int:
    if args.max is None and args.per_second is None and args.burst is None:
        raise ConfigError(f"limits set {args.key}: give --max, --per-second or --burst")
    limiter = _open(args)
    try:
        limiter.set_limit(args.key, Override(args.max, args.per_second, args.burst))
    finally:
        limiter.close()
    print(f"{args.key}: {_limit_text(args.max, args.per_second, args.burst)} (every worker, "
          "from its next claim)")
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
