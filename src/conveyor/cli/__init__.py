"""The `conveyor` command: one entry point, one sub-command per daemon or tool.

Each command group is one module of this package (`status`, `deadletters`, `runs`, `dags`,
`enqueue`, `ui`, `up`, `configuration`, `demo`); the daemons (`worker`, `scheduler`, `autoscaler`)
register their own flags from their packages. The parser is built once per run and returns
the settings catalog its flags filled (what `config show` prints and the file is checked
against).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from conveyor import config, logs
from conveyor.config import Catalog, SettingsParser
from conveyor.errors import BrokerError, ConveyorError, ResultError, StateStoreUnavailable

Command = Callable[[argparse.Namespace], int]

#: Long-running commands that import only their own module: a worker's footprint must not
#: carry the scheduler's, the autoscaler's or the operator tools' imports.
LEAN = {"worker": "conveyor.worker.cli"}
#: Every other command group, in the order `conveyor --help` lists them.
COMMANDS = ("conveyor.cli.demo", "conveyor.worker.cli", "conveyor.cli.enqueue",
            "conveyor.scheduler.cli", "conveyor.cli.dags", "conveyor.cli.runs",
            "conveyor.autoscaler.cli", "conveyor.cli.configuration", "conveyor.cli.status",
            "conveyor.cli.deadletters", "conveyor.cli.limits", "conveyor.cli.ui",
            "conveyor.cli.up")


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, Catalog]:
    """The parser (only `command`'s when it is a lean one) and the settings it declares."""
    parser = SettingsParser(prog="conveyor", description=(__doc__ or "").split("\n\n")[0])
    parser.catalog.declare_settings()
    commands = parser.add_subparsers(dest="command", required=True)
    for module in [LEAN[command]] if command in LEAN else COMMANDS:
        importlib.import_module(module).register(commands)
    _log_flags(commands)
    return parser, parser.catalog


def _hide_from_tasks() -> None:
    """Non-dumpable first thing: the daemons hold credentials and start workers whose tasks
    may run as the same uid (README: Security model); no /proc/<pid>/environ, mem or ptrace."""
    from conveyor.worker.isolation import make_non_dumpable
    make_non_dumpable()


#: Commands that run for a while and log: they take --log-level and --log-format.
DAEMONS = ("worker", "scheduler", "autoscaler", "ui", "up")


def _log_flags(commands: argparse._SubParsersAction) -> None:
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
        if argv and argv[0] in DAEMONS:
            _hide_from_tasks()
        parser, catalog = build_parser(argv[0] if argv else None)
        args = parser.parse_args(argv)
        if not argv or argv[0] not in LEAN:   # a lean parser knows only its own keys
            catalog.check_file()
        args.parser, args.catalog = parser, catalog   # for `config show`, which re-parses
        _setup_logging(args)
        run: Command = args.run
        return run(args)
    except ConveyorError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return exit_code(exc)


def exit_code(exc: ConveyorError) -> int:
    """2 when the command itself needs correcting (a value, a name, a file); 1 when it was
    right but the world failed it (a broker unreachable or lost, a task that failed), so a
    script can tell "fix the command" from "try again later"."""
    return 1 if isinstance(exc, BrokerError | StateStoreUnavailable | ResultError) else 2
