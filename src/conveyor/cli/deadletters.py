"""`conveyor dead-letters list|show|requeue|purge`: see and fix quarantined messages.

A message is dead-lettered with a reason: malformed or unsigned, an unknown task, out of
retries, or over its delivery budget (a poison message that kills its runner). Select by
queue (`-Q`, repeatable; default: the queues in use), by id (`--id`, repeatable) and by
reason (`--reason TEXT`, a case-insensitive substring). `requeue` puts the selection back
on its queue with a fresh delivery count; `purge` deletes it for good. Both need a
selection (`--id`, `--reason` or `--all`), so nothing is requeued or lost by accident.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.broker import Broker, DeadLetter
from conveyor.cli.connections import connection_flags, known_queues, opened_broker, opened_store
from conveyor.cli.output import output
from conveyor.cli.output import progress as show_progress
from conveyor.errors import ConfigError
from conveyor.scheduler.runs import iso

#: Dead letters read per queue (a requeue of more goes in rounds).
SCAN = 100_000
#: Ids per requeue or purge call: progress is reported between batches.
BATCH = 500


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser("dead-letters", help="list, show, requeue or purge dead "
                                "letters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = group.add_subparsers(dest="dead_command", required=True)
    listing = verbs.add_parser("list", help="dead letters: id, queue, task, reason")
    _selection(listing)
    listing.add_argument("--limit", type=int, default=100, help="per queue (default 100)")
    listing.set_defaults(run=run_list)
    show = verbs.add_parser("show", help="one dead letter with its whole body")
    show.add_argument("id", help="its id (from `dead-letters list`)")
    _selection(show, ids=False)
    show.set_defaults(run=run_show)
    for verb, run, what in (("requeue", run_requeue, "put back on their queue"),
                            ("purge", run_purge, "delete for good")):
        p = verbs.add_parser(verb, help=f"dead letters selected by id, reason or --all: {what}")
        _selection(p)
        p.add_argument("--all", action="store_true", help="every dead letter of the queues")
        p.set_defaults(run=run)


def _selection(p: argparse.ArgumentParser, *, ids: bool = True) -> None:
    p.add_argument("-Q", "--queue", action="append", default=[], help="queue (repeatable; "
                   "default: the queues workers and recent runs use)")
    if ids:
        p.add_argument("--id", action="append", default=[], dest="ids", help="id (repeatable)")
    p.add_argument("--reason", default="", help="only those whose reason contains this text")
    connection_flags(p)


def queues(args: argparse.Namespace) -> list[str]:
    if args.queue:
        return list(dict.fromkeys(args.queue))
    with opened_store(args) as store:
        return known_queues(store)


def select(broker: Broker, queue: str, args: argparse.Namespace,
           limit: int = SCAN) -> list[DeadLetter]:
    """The queue's dead letters that match --id and --reason."""
    found = broker.dead_letters(queue, limit=limit)
    ids = set(getattr(args, "ids", []) or [])
    reason = args.reason.lower()
    return [d for d in found if (not ids or d.id in ids) and reason in d.reason.lower()]


def summary(dead: DeadLetter) -> dict[str, Any]:
    body = _body(dead.body)
    label = body.get("task") or " ".join(body.get("command") or []) if body else ""
    return {"id": dead.id, "queue": dead.queue, "task": label or "?",
            "message_id": body.get("id", "") if body else "",
            "deliveries": dead.delivery_count, "dead_at": iso(dead.dead_at),
            "reason": dead.reason}


def _body(raw: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def run_list(args: argparse.Namespace) -> int:
    names = queues(args)
    with opened_broker(args) as broker:
        rows = [summary(d) for q in names for d in select(broker, q, args, args.limit)]
    output({"queues": names, "dead_letters": rows}, [{**r, "reason": r["reason"][:70]}
           for r in rows], ["id", "queue", "task", "deliveries", "dead_at", "reason"], args.json)
    return 0


def run_show(args: argparse.Namespace) -> int:
    with opened_broker(args) as broker:
        for queue in queues(args):
            for dead in broker.dead_letters(queue, limit=SCAN):
                if dead.id == args.id:
                    _print_one(dead, args.json)
                    return 0
    raise ConfigError(f"no dead letter {args.id!r} in queues {', '.join(queues(args))}: "
                      "check the id with `conveyor dead-letters list`, and pass its -Q queue")


def _print_one(dead: DeadLetter, as_json: bool) -> None:
    body = _body(dead.body)
    doc = {**summary(dead), "body": body if body is not None else
           dead.body.decode("utf-8", "replace")}
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    for key in ("id", "queue", "task", "message_id", "deliveries", "dead_at", "reason"):
        print(f"{key + ':':12} {doc[key]}")
    print("body:")
    print(json.dumps(body, indent=2) if body is not None else doc["body"])


def run_requeue(args: argparse.Namespace) -> int:
    return _apply(args, "requeued", lambda b, q, ids: b.requeue_dead(q, ids))


def run_purge(args: argparse.Namespace) -> int:
    return _apply(args, "deleted", lambda b, q, ids: b.purge_dead(q, ids))


Action = Callable[[Broker, str, Sequence[str] | None], int]


def _apply(args: argparse.Namespace, verb: str, action: Action) -> int:
    """Requeue or purge the selection, queue by queue, in batches with progress."""
    if not (args.ids or args.reason or args.all):
        raise ConfigError(f"say which dead letters: --id ID, --reason TEXT or --all "
                          f"(nothing was {verb})")
    names = queues(args)
    counts: dict[str, int] = {}
    started = time.monotonic()
    with opened_broker(args) as broker:
        for queue in names:
            counts[queue] = _apply_queue(broker, queue, args, verb, action)
    total = sum(counts.values())
    if args.json:
        print(json.dumps({verb: total, "queues": counts}))
    else:
        print(f"{verb} {total} dead letter(s) in {time.monotonic() - started:.1f} s"
              + "".join(f"\n  {q}: {n}" for q, n in counts.items() if n))
    return 0


def _apply_queue(broker: Broker, queue: str, args: argparse.Namespace, verb: str,
                 action: Action) -> int:
    if args.all and not args.ids and not args.reason:
        return action(broker, queue, None)
    ids = [d.id for d in select(broker, queue, args)]
    done = 0
    for start in range(0, len(ids), BATCH):
        done += action(broker, queue, ids[start:start + BATCH])
        show_progress(min(start + BATCH, len(ids)), len(ids), f"{verb} on {queue}")
    return done
