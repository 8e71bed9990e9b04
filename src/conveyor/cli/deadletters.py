"""`conveyor dead-letters list|show|requeue|purge`: see and fix quarantined messages.

A message is dead-lettered with a reason: malformed or unsigned, an unknown task, out of
retries, or over its delivery budget (a poison message that kills its runner). Select by
queue (`-Q`, repeatable; default: the queues in use and every queue holding dead letters,
as the broker lists them; kombu cannot), by id (`--id`, repeatable) and by
reason (`--reason TEXT`, a case-insensitive substring). `requeue` puts the selection back
on its queue with a fresh delivery count, keeping its attempt count (a message that spent
its retries gets one more try); `requeue --fresh` starts it again at attempt 1 (a fresh
retry budget). `purge` deletes it for good. Both need a
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

from conveyor.broker import Administrator, DeadLetter
from conveyor.cli.connections import (
    broker_url,
    connection_flags,
    nothing_yet,
    opened_broker,
    opened_store,
    settings,
    state_url,
)
from conveyor.cli.output import output, terminal_width, wrapped_table
from conveyor.cli.output import progress as show_progress
from conveyor.config import checked
from conveyor.errors import ConfigError
from conveyor.kinds import positive_int
from conveyor.message import Codec
from conveyor.readers.deadletters import (
    SCAN,
    body_preview,
    message_id,
    parsed,
    requeue,
    summary,
)
from conveyor.readers.deadletters import select as select_dead
from conveyor.readers.queues import known_queues

#: Ids per requeue or purge call: progress is reported between batches.
BATCH = 500


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        p.set_defaults(run=run, fresh=False)
    verbs.choices["requeue"].add_argument(
        "--fresh", action="store_true", help="with a fresh retry budget: the message starts "
        "again at attempt 1 (default: it keeps its attempt count, so a message that spent its "
        "retries gets one more try; a DAG task gets a fresh budget with `tasks clear`)")


def _selection(p: argparse.ArgumentParser, *, ids: bool = True) -> None:
    p.add_argument("-Q", "--queue", action="append", default=[], help="queue (repeatable; "
                   "default: the queues workers and recent runs use, and every queue holding "
                   "dead letters)")
    if ids:
        p.add_argument("--id", action="append", default=[], dest="ids", help="id (repeatable)")
    p.add_argument("--reason", default="", help="only those whose reason contains this text")
    connection_flags(p)


def queues(args: argparse.Namespace, broker: Administrator) -> list[str]:
    """-Q's queues, else those in use and every one holding dead letters."""
    if args.queue:
        return list(dict.fromkeys(args.queue))
    if nothing_yet(state_url(args)):
        return known_queues(None, broker=broker)   # reading creates no store
    with opened_store(args) as store:
        return known_queues(store, broker=broker)


def select(broker: Administrator, queue: str, args: argparse.Namespace,
           limit: int = SCAN) -> list[DeadLetter]:
    """The queue's dead letters that match --id and --reason."""
    return select_dead(broker, queue, getattr(args, "ids", []) or [], args.reason, limit)


def run_list(args: argparse.Namespace) -> int:
    names, rows = [], []
    if nothing_yet(broker_url(args)):   # a broker file nothing wrote holds no letters
        names = list(dict.fromkeys(args.queue))
    else:
        with opened_broker(args) as broker:
            names = queues(args, broker)
            rows = [summary(d) for q in names for d in select(broker, q, args, args.limit)]
    columns = ["id", "queue", "task", "deliveries", "dead_at", "reason"]
    if args.json:
        output({"queues": names, "dead_letters": rows}, [], [], True)
    else:
        print(wrapped_table(rows, columns, terminal_width(args.wide)))
    return 0


def run_show(args: argparse.Namespace) -> int:
    if nothing_yet(broker_url(args)):   # reading creates no broker file
        raise ConfigError(f"no dead letter or message {args.id!r}: the broker "
                          f"{nothing_yet(broker_url(args))}")
    with opened_broker(args) as broker:
        names = queues(args, broker)
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
    codec = settings(args).codec()
    how = ("with a fresh retry budget (attempt 1)" if args.fresh else
           "each keeping its attempt count: one more try each (--fresh: a fresh retry budget)")
    return _apply(args, "requeued",
                  lambda b, q, dead: _requeue(b, q, dead, codec, args.fresh), how)


def run_purge(args: argparse.Namespace) -> int:
    return _apply(args, "deleted", lambda b, q, dead: b.purge_dead(q, _ids(dead)))


#: What requeue and purge do to a queue's selected dead letters (None: all of them).
Action = Callable[[Administrator, str, Sequence[DeadLetter] | None], int]


def _ids(dead: Sequence[DeadLetter] | None) -> list[str] | None:
    return None if dead is None else [d.id for d in dead]


def _requeue(broker: Administrator, queue: str, dead: Sequence[DeadLetter] | None, codec: Codec,
             fresh: bool) -> int:
    """`requeue`, saying on stderr which ones could not be given a fresh budget."""
    done, unreadable = requeue(broker, queue, dead, codec, fresh=fresh)
    if unreadable and fresh:
        print(f"conveyor: {unreadable} dead letter(s) of {queue!r} are not messages this "
              "codec reads (no attempt to reset): requeued as they were", file=sys.stderr)
    return done


def _apply(args: argparse.Namespace, verb: str, action: Action, how: str = "") -> int:
    """Requeue or purge the selection, queue by queue, in batches with progress; `how`
    says what the requeued messages get."""
    if not (args.ids or args.reason or args.all):
        raise ConfigError(f"say which dead letters: --id ID, --reason TEXT or --all "
                          f"(nothing was {verb})")
    counts: dict[str, int] = {}
    started = time.monotonic()
    with opened_broker(args) as broker:
        names = queues(args, broker)
        _all_ids_there(broker, names, args.ids, verb)
        for queue in names:
            counts[queue] = _apply_queue(broker, queue, args, verb, action)
    total = sum(counts.values())
    if args.json:
        print(json.dumps({verb: total, "queues": counts}
                         | ({"fresh": bool(args.fresh)} if verb == "requeued" else {})))
    else:
        print(f"{verb} {total} dead letter(s){' ' + how if how else ''} in "
              f"{time.monotonic() - started:.1f} s"
              + "".join(f"\n  {q}: {n}" for q, n in counts.items() if n))
    return 0


def _all_ids_there(broker: Administrator, names: Sequence[str], ids: Sequence[str],
                   verb: str) -> None:
    """A wrong --id is an error, before anything is done: "requeued 0" would look like a
    success to a script."""
    if not ids:
        return
    found = {d.id for queue in names for d in select_dead(broker, queue, ids)}
    missing = [i for i in dict.fromkeys(ids) if i not in found]
    if missing:
        raise ConfigError(f"no dead letter {', '.join(map(repr, missing))} in queues "
                          f"{', '.join(names)} (nothing was {verb}): check the ids with "
                          "`conveyor dead-letters list`, and pass their -Q queue")


def _apply_queue(broker: Administrator, queue: str, args: argparse.Namespace, verb: str,
                 action: Action) -> int:
    if args.all and not args.ids and not args.reason:
        return action(broker, queue, None)
    chosen = select(broker, queue, args)
    done = 0
    for start in range(0, len(chosen), BATCH):
        done += action(broker, queue, chosen[start:start + BATCH])
        show_progress(min(start + BATCH, len(chosen)), len(chosen), f"{verb} on {queue}")
    return done
