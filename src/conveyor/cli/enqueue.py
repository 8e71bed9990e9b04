"""`conveyor enqueue NAME`: publish a task (or, with --command, a shell command) from a shell.

The queue is -Q's, else the task's own (`@task(queue="heavy")`) when its module imports
from here (`billing.tasks.clean_orders` -> `billing.tasks`, the current directory on the
path), with the task's other options too; else `default`. A line on stderr says which.

With --wait the message asks for its result: the command waits for it (woken by the result
store), prints the return value as JSON, alone on stdout (so `$(conveyor enqueue … --wait)`
is the value; the id is on stderr), and exits 0, or prints the failure and exits 1, also
when --timeout (300 s by default) passes first. While it waits, it says so when nothing has
taken the message off its queue for a while (no worker consumes that queue?).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

from conveyor import broker as brokers
from conveyor.cli.output import json_argument
from conveyor.client import Client
from conveyor.config import Settings, checked, env_flag
from conveyor.errors import ConfigError, ResultError, ResultTimeout
from conveyor.flow import unique_key_of
from conveyor.kinds import non_negative_int, seconds
from conveyor.message import Message
from conveyor.results.handle import ResultHandle
from conveyor.tasks import REGISTRY, Task

#: Seconds --wait waits unless told (0: for ever).
WAIT_TIMEOUT = 300.0
#: Seconds a message may sit untaken on its queue before --wait says so.
UNTAKEN_HINT = 10.0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("enqueue", help="publish a task from the command line",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="registered task name, or with --command the program to run")
    p.add_argument("--command", nargs=argparse.REMAINDER, default=None,
                   help="publish NAME followed by these words as a shell-command workload")
    p.add_argument("-Q", "--queue", default=None, help="queue to publish to (default: the "
                   "task's own when its module imports from here, else default)")
    p.add_argument("--args", type=json_argument(list), default=[],
                   help="positional args, a JSON list")
    p.add_argument("--kwargs", type=json_argument(dict), default={},
                   help="keyword args, a JSON object")
    p.add_argument("--delay", type=checked(seconds), default=0.0, help="seconds before it may run")
    p.add_argument("--expires", type=checked(seconds), default=0.0,
                   help="seconds from now by which it must have started; a worker that takes "
                        "it later dead-letters it unrun, reason expired (0: never)")
    p.add_argument("--priority", type=checked(non_negative_int), default=None)
    p.add_argument("--wait", action="store_true", help="wait for the result and print it as "
                   "JSON, alone on stdout (the message id goes to stderr)")
    p.add_argument("--timeout", type=checked(seconds), default=WAIT_TIMEOUT,
                   help=f"give up waiting after S seconds (default {WAIT_TIMEOUT:g}; 0: never)")
    p.add_argument("--unique-key", default="", metavar="KEY",
                   help="publish only if no message holds KEY (held until its outcome, or "
                        "--unique-for); else publish nothing and print the holder's id with "
                        '"duplicate": true (default: the task\'s own unique_key when its '
                        "module imports from here)")
    p.add_argument("--unique-for", type=checked(seconds), default=0.0, metavar="S",
                   help="hold --unique-key for S seconds from now whatever happens "
                        "(0: until the task's outcome)")
    env_flag(p, env="CONVEYOR_BROKER_URL")
    p.set_defaults(run=run_enqueue)


def run_enqueue(args: argparse.Namespace) -> int:
    if args.expires and args.expires <= args.delay:
        raise ConfigError(f"--expires {args.expires:g} is not after --delay {args.delay:g}: "
                          "the message would expire before it may run")
    settings = Settings.from_env(broker_url=args.broker or None)
    broker = brokers.from_url(settings.broker_url)   # the client publishes, we inspect
    client = Client(broker, settings.codec(), settings=settings)
    message, source = _message(args)
    key, window = _unique(args)
    try:
        sent = client.enqueue(message, args.delay, keep_result=args.wait, unique_key=key,
                              unique_for=window)
        sent_doc: dict[str, object] = {"id": sent.id, "queue": sent.queue, "task": sent.label}
        if sent.duplicate:
            sent_doc["duplicate"] = True
            print(f"conveyor: not enqueued: {sent.id} holds unique key {key!r}",
                  file=sys.stderr, flush=True)
        else:
            print(f"conveyor: enqueued {sent.id} on queue {sent.queue!r} ({source})",
                  file=sys.stderr, flush=True)
        if not args.wait:
            print(json.dumps(sent_doc), flush=True)
            return 0
        try:
            value = _wait(client, broker, sent, args.timeout)
        except ResultError as exc:
            print(f"conveyor: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(value))
        return 0
    finally:
        client.close()


def _message(args: argparse.Namespace) -> tuple[Message, str]:
    """The message to publish, and where its queue came from (said on stderr)."""
    fields: dict[str, Any] = {k: v for k, v in (("queue", args.queue),
                                                ("priority", args.priority)) if v is not None}
    if args.expires:
        fields["expires"] = time.time() + args.expires
    if args.command is not None:
        return (Message(command=(args.name, *args.command), **{"queue": "default", **fields}),
                "-Q" if args.queue else "the default queue; -Q names another")
    task = _importable_task(args.name)
    if task is not None:
        return (task.message(args.args, args.kwargs, **fields),
                "-Q" if args.queue else f"the task's own, from {task.fn.__module__}")
    return (Message(task=args.name, args=tuple(args.args), kwargs=args.kwargs,
                    **{"queue": "default", **fields}),
            "-Q" if args.queue else "the default queue: the task's module does not import "
            "from here, so its own queue is unknown; -Q names it")


def _unique(args: argparse.Namespace) -> tuple[str, float]:
    """The unique key and window: the flags', else the importable task's own (as its
    `task.enqueue` would hold them)."""
    key, window = args.unique_key, args.unique_for
    task = _importable_task(args.name) if args.command is None and not key else None
    if task is not None and task.options.unique_key:
        key = unique_key_of(task.fn, task.options.unique_key, args.args, args.kwargs)
        window = window or task.options.unique_for
    if window and not key:
        raise ConfigError("--unique-for needs --unique-key: the key to hold for that long")
    return key, window


def _importable_task(name: str) -> Task[Any, Any] | None:
    """The task registered as `name` once its module (the name up to its last dot) is
    imported from the current directory; None when it cannot be (the task then keeps the
    name alone: a worker elsewhere may know it)."""
    module = name.rpartition(".")[0]
    if not module:
        return None
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except Exception:   # not importable here, or broken: the worker will say what it is
        return None
    return REGISTRY.get(name)


def _wait(client: Client, queues: brokers.Inspector, sent: ResultHandle,
          timeout: float) -> Any:
    """The task's value, waiting at most `timeout` seconds (0: for ever); once, when the
    message has sat untaken on its queue for UNTAKEN_HINT seconds, say so on stderr."""
    deadline = time.monotonic() + timeout if timeout else float("inf")
    hinted = False
    while True:
        left = deadline - time.monotonic()
        try:
            return sent.result(timeout=max(0.0, min(left, UNTAKEN_HINT)))
        except ResultTimeout:
            if time.monotonic() >= deadline:
                raise ResultTimeout(f"no result for {sent.id} within {timeout:g} s: "
                                    + _where(queues, sent)) from None
        if not hinted and _untaken(queues, sent):
            hinted = True
            print(f"conveyor: still waiting: {_where(queues, sent)}", file=sys.stderr,
                  flush=True)


def _untaken(queues: brokers.Inspector, sent: ResultHandle) -> bool:
    """Whether nothing has taken anything off the message's queue: work ready there, none
    in flight (a worker that consumes it would hold it)."""
    depth = queues.depth(sent.queue)
    return sent.status() == "pending" and depth.ready > 0 and depth.in_flight == 0


def _where(queues: brokers.Inspector, sent: ResultHandle) -> str:
    if _untaken(queues, sent):
        return (f"it is still queued on {sent.queue!r} and nothing has taken it: is a "
                f"worker consuming that queue? (`conveyor worker -Q {sent.queue}`)")
    return f"it is {sent.status()} (queue {sent.queue!r})"
