"""`conveyor dead-letters list|show|requeue|purge`: see and fix quarantined messages.

A message is dead-lettered with a reason: malformed or unsigned, an unknown task, out of
retries, or over its delivery budget (a poison message that kills its runner). Select by
queue (`-Q`, repeatable; default: the queues in use), by id (`--id`, repeatable) and by
reason (`--reason TEXT`, a case-insensitive substring). `requeue` puts the selection back
on its queue with a fresh delivery count; `purge` deletes it for good. Both need a
selection (`--id`, `--reason` or `--all`), so nothing is requeued or lost by accident.

`show` takes the dead letter's id or the message id `conveyor enqueue` printed (a Celery
task id, for messages the Celery intake rejected). It prints a text body (JSON indented) up
to 16 KiB, and for anything else its size and the first bytes in hex: `--raw` writes the
whole body, byte for byte, to stdout.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable, Sequence

from conveyor.broker import Broker, DeadLetter
from conveyor.cli.connections import connection_flags, opened_broker, opened_store
from conveyor.cli.output import output, terminal_width, wrapped_table
from conveyor.cli.output import progress as show_progress
from conveyor.config import checked, positive_int
from conveyor.errors import ConfigError
from conveyor.readers.deadletters import SCAN, body_preview, message_id, parsed, summary
from conveyor.readers.deadletters import select as select_dead
from conveyor.readers.queues import known_queues

#: Ids per requeue or purge call: progress is reported between batches.
BATCH = 500


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser("dead-letters", help="list, show, requeue or purge dead "
                                "letters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = group.add_subparsers(dest="dead_command", required=True)
    listing = verbs.add_parser("list", help="dead letters: id, queue, task, reason")
    _selection(listing)
    listing.add_argument("--limit", type=checked(positive_int), default=100,
                         help="per queue (default 100)")
    listing.add_argument("--wide", action="store_true", help="each reason whole on one line "
                         "(default: reasons wrap to the terminal's width)")
    listing.set_defaults(run=run_list)
    show = verbs.add_parser("show", help="one dead letter: its reason and body")
    show.add_argument("id", help="its id (from `dead-letters list`), or the message id "
                      "`conveyor enqueue` printed")
    show.add_argument("--raw", action="store_true", help="write the whole body, byte for byte, "
                      "to stdout (and nothing else)")
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
    return select_dead(broker, queue, getattr(args, "ids", []) or [], args.reason, limit)


def run_list(args: argparse.Namespace) -> int:
    names = queues(args)
    with opened_broker(args) as broker:
        rows = [summary(d) for q in names for d in select(broker, q, args, args.limit)]
    columns = ["id", "queue", "task", "deliveries", "dead_at", "reason"]
    if args.json:
        output({"queues": names, "dead_letters": rows}, [], [], True)
    else:
        print(wrapped_table(rows, columns, terminal_width(args.wide)))
    return 0


def run_show(args: argparse.Namespace) -> int:
    names = queues(args)
    with opened_broker(args) as broker:
        found = [d for q in names for d in broker.dead_letters(q, limit=SCAN)
                 if args.id in (d.id, message_id(d))]
    if not found:
        raise ConfigError(f"no dead letter or message {args.id!r} in queues "
                          f"{', '.join(names)}: check the id with `conveyor dead-letters "
                          "list`, and pass its -Q queue")
    if (args.raw or args.json) and len(found) > 1:
        raise ConfigError(f"{args.id!r} names {len(found)} dead letters (the message died "
                          f"more than once): pass one of their ids, "
                          f"{', '.join(d.id for d in found)}")
    if args.raw:
        sys.stdout.buffer.write(found[0].body)
        sys.stdout.flush()
        return 0
    for index, dead in enumerate(found):
        print("\n" if index else "", end="")
        _print_one(dead, args.json)
    return 0


def _print_one(dead: DeadLetter, as_json: bool) -> None:
    body = parsed(dead.body)
    if as_json:
        raw = {"body": body} if body is not None else {
            "body_base64": base64.b64encode(dead.body).decode()}
        print(json.dumps({**summary(dead), "body_bytes": len(dead.body), **raw}, indent=2))
        return
    doc = summary(dead)
    for key in ("id", "queue", "task", "message_id", "deliveries", "dead_at", "reason"):
        print(f"{key + ':':12} {doc[key]}")
    print("\n".join(body_preview(dead.body)))


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
