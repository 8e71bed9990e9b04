"""The `conveyor` command: one entry point, one sub-command per daemon or tool."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Sequence

from conveyor import broker as brokers
from conveyor import config, logs
from conveyor.errors import ConveyorError
from conveyor.message import Codec, Message

Command = Callable[[argparse.Namespace], int]


def cmd_demo(args: argparse.Namespace) -> int:
    """Enqueue a few messages on the embedded default broker and consume them back."""
    broker = brokers.from_url(args.broker)
    codec = Codec()
    print(f"broker: {brokers.redact(args.broker or brokers.default_url())}")
    for i in range(args.count):
        broker.publish("demo", codec.encode(Message(queue="demo", task="demo.echo", args=(i,))))
    print(f"published {args.count} messages to queue 'demo': {broker.depth('demo')}")
    started = time.monotonic()
    done = 0
    for delivery in broker.consume(["demo"], prefetch=8, timeout=0.5):
        if delivery is None:
            break
        message = codec.decode(delivery.body)
        broker.ack(delivery)
        done += 1
        print(f"  consumed {message.id} {message.task}{tuple(message.args)}")
    elapsed = time.monotonic() - started
    print(f"consumed and acked {done} in {elapsed * 1000:.1f} ms: {broker.depth('demo')}")
    broker.close()
    return 0


#: Long-running commands that import only their own module: a worker's footprint must not
#: carry the scheduler's, the autoscaler's or the operator tools' imports.
LEAN = {"worker": "conveyor.worker.cli"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conveyor", description=__doc__)
    config.declare_settings()
    commands = parser.add_subparsers(dest="command", required=True)
    if command in LEAN:
        importlib.import_module(LEAN[command]).register(commands)
        _log_flags(commands)
        return parser
    demo = commands.add_parser("demo", help=cmd_demo.__doc__)
    demo.add_argument("--broker", default=None, help="broker URL (default: embedded SQLite)")
    demo.add_argument("--count", type=int, default=5)
    demo.set_defaults(run=cmd_demo)
    from conveyor import enqueue
    from conveyor.worker import cli as worker_cli
    worker_cli.register(commands)
    enqueue.register(commands)
    from conveyor.scheduler import cli as scheduler_cli
    scheduler_cli.register(commands)
    from conveyor.autoscaler import cli as autoscaler_cli
    autoscaler_cli.register(commands)
    from conveyor import config_cli, deadletters, runs_cli, status, up
    config_cli.register(commands)
    status.register(commands)
    deadletters.register(commands)
    runs_cli.register(commands)
    up.register(commands)
    _log_flags(commands)
    return parser


#: Commands that run for a while and log: they take --log-level and --log-format.
DAEMONS = ("worker", "scheduler", "autoscaler", "up")


def _log_flags(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name in DAEMONS:
        if name in commands.choices:
            config.env_flag(commands.choices[name], "--log-format", env="CONVEYOR_LOG_FORMAT",
                            default="human", kind=logs.log_format,
                            help="log lines for people (human) or one JSON object each (json)")


def _setup_logging(args: argparse.Namespace) -> None:
    """One logging set-up for every daemon (the scheduler's --json implies JSON logs)."""
    if getattr(args, "log_format", None) is None:
        return
    as_json = args.log_format == "json" or (args.command == "scheduler" and args.json)
    logs.setup(getattr(args, "log_level", "INFO"), "json" if as_json else "human")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        if not argv or argv[0] not in LEAN:   # a lean parser knows only its own keys
            config.check_file()
        _setup_logging(args)
        run: Command = args.run
        return run(args)
    except ConveyorError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
