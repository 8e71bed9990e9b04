"""`conveyor enqueue NAME`: publish a task (or, with --command, a shell command) from a shell.

With --wait the message asks for its result: the command waits for it (woken by the result
store, no polling), prints the return value as JSON and exits 0, or prints the failure and
exits 1 (also when --timeout passes first).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from conveyor import broker as brokers
from conveyor.cli.output import json_argument
from conveyor.client import Client
from conveyor.config import Settings, checked, env_flag, non_negative_int, seconds, url
from conveyor.errors import ResultError
from conveyor.message import Message


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
    p.add_argument("--delay", type=checked(seconds), default=0.0, help="seconds before it may run")
    p.add_argument("--priority", type=checked(non_negative_int), default=0)
    p.add_argument("--wait", action="store_true", help="wait for the result and print it as JSON")
    p.add_argument("--timeout", type=checked(seconds), default=0.0,
                   help="give up waiting after S (0: never)")
    env_flag(p, "-b", "--broker", env="CONVEYOR_BROKER_URL", default="", kind=url,
             help="broker URL (default: the embedded SQLite file)")
    p.set_defaults(run=run_enqueue)


def run_enqueue(args: argparse.Namespace) -> int:
    settings = Settings.from_env(broker_url=args.broker or None)
    client = Client(brokers.from_url(settings.broker_url), settings.codec(), settings=settings)
    fields: dict[str, Any] = {"queue": args.queue, "priority": args.priority}
    if args.command is not None:
        message = Message(command=(args.name, *args.command), **fields)
    else:
        message = Message(task=args.name, args=tuple(args.args), kwargs=args.kwargs, **fields)
    try:
        sent = client.enqueue(message, args.delay, keep_result=args.wait)
        print(json.dumps({"id": sent.id, "queue": sent.queue, "task": sent.label}), flush=True)
        if not args.wait:
            return 0
        try:
            value = sent.result(timeout=args.timeout or None)
        except ResultError as exc:
            print(f"conveyor: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(value))
        return 0
    finally:
        client.close()
