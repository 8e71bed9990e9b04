"""`conveyor enqueue NAME`: publish a task (or, with --command, a shell command) from a shell.

With --wait it names a private reply queue as `reply_to`, follows the events the worker sends
there, prints the final one and exits 0 on success, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from conveyor import broker as brokers
from conveyor.cli.output import json_argument
from conveyor.client import Client
from conveyor.config import Settings, env_flag
from conveyor.errors import ConfigError
from conveyor.events import FINAL, Event
from conveyor.message import Message, new_id


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("enqueue", help="publish a task from the command line",
                            description=__doc__)
    p.add_argument("name", help="registered task name, or with --command the program to run")
    p.add_argument("--command", nargs=argparse.REMAINDER, default=None,
                   help="publish NAME followed by these words as a shell-command workload")
    p.add_argument("-Q", "--queue", default="default", help="queue to publish to")
    p.add_argument("--args", type=json_argument(list), default=[],
                   help="positional args, a JSON list")
    p.add_argument("--kwargs", type=json_argument(dict), default={},
                   help="keyword args, a JSON object")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before it may run")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--wait", action="store_true", help="wait for the outcome and print it")
    p.add_argument("--timeout", type=float, default=0.0, help="give up waiting after S (0: never)")
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="",
             help="broker URL (default: the embedded SQLite file)")
    p.set_defaults(run=run_enqueue)


def run_enqueue(args: argparse.Namespace) -> int:
    settings = Settings.from_env(broker_url=args.broker or None)
    client = Client(brokers.from_url(settings.broker_url), settings.codec())
    reply_to = f"conveyor.reply.{new_id()}" if args.wait else ""
    fields: dict[str, Any] = {"queue": args.queue, "priority": args.priority,
                              "reply_to": reply_to}
    if args.command is not None:
        message = Message(command=(args.name, *args.command), **fields)
    else:
        message = Message(task=args.name, args=tuple(args.args), kwargs=args.kwargs, **fields)
    try:
        sent = client.enqueue(message, args.delay)
        print(json.dumps({"id": sent.id, "queue": sent.queue, "task": sent.label}))
        if not args.wait:
            return 0
        final = wait_for_outcome(client, reply_to, args.timeout)
        print(final.encode().decode())
        return 0 if final.kind == "succeeded" else 1
    finally:
        if reply_to:
            client.broker.purge(reply_to)
        client.close()


def wait_for_outcome(client: Client, reply_to: str, timeout: float) -> Event:
    """Follow events on `reply_to` until the message is settled for good."""
    deadline = time.monotonic() + timeout if timeout else float("inf")
    for delivery in client.broker.consume([reply_to], prefetch=16, timeout=1.0):
        if delivery is not None:
            client.broker.ack(delivery)
            event = Event.decode(delivery.body)
            print(f"{event.kind} attempt={event.attempt} host={event.hostname}", file=sys.stderr)
            if event.kind in FINAL:
                return event
        if time.monotonic() > deadline:
            raise ConfigError(f"no outcome within {timeout:.0f}s on {reply_to}: is a worker "
                              f"consuming the queue?")
    raise AssertionError("unreachable")
