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
import logging
import os
import sys
from collections.abc import Callable, Sequence

from conveyor import config, logs
from conveyor.broker import reconnect
from conveyor.config import Catalog, SettingsParser
from conveyor.errors import (
    BrokerError,
    ConveyorError,
    Refused,
    ResultError,
    StateStoreUnavailable,
)

Command = Callable[[argparse.Namespace], int]

#: Long-running commands that import only their own module: a worker's footprint must not
#: carry the scheduler's, the autoscaler's or the operator tools' imports.
LEAN = {"worker": "conveyor.worker.cli"}
#: Every other command group, in the order `conveyor --help` lists them.
COMMANDS = ("conveyor.cli.demo", "conveyor.worker.cli", "conveyor.cli.enqueue",
            "conveyor.scheduler.cli", "conveyor.cli.dags", "conveyor.cli.runs",
            "conveyor.cli.assets", "conveyor.cli.triggerer",
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
DAEMONS = ("worker", "scheduler", "triggerer", "autoscaler", "ui", "up")


def _log_flags(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name in DAEMONS:
        if name in commands.choices:
            config.env_flag(commands.choices[name], env="CONVEYOR_LOG_FORMAT")


def _warn_about_passwords(argv: list[str], args: argparse.Namespace, catalog: Catalog) -> None:
    """A daemon given a password in a flag says so at start (README: Security model)."""
    for key in config.passwords_in_argv(argv, args, catalog):
        logging.getLogger("conveyor").warning(
            "%s holds a password on the command line, where every process on this host can "
            "read it for as long as this %s runs (/proc/<pid>/cmdline, ps; its tasks too, "
            "even under --uid): give it in %s or as %s in the config file instead",
            key.flags[0] if key.flags else key.env, args.command, key.env, key.name)


def _setup_logging(args: argparse.Namespace) -> None:
    """One logging set-up for every daemon (the scheduler's --json implies JSON logs)."""
    if getattr(args, "log_format", None) is None:
        return
    as_json = args.log_format == "json" or (args.command == "scheduler" and args.json)
    logs.setup(getattr(args, "log_level", "INFO"), "json" if as_json else "human")


#: What a command whose reader went away exits with: 128 + SIGPIPE, as `cat` or `grep`
#: killed by the signal would (Python ignores SIGPIPE, so the write raises instead).
EXIT_PIPE_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A reader that stops early (`conveyor status | head -1`) ends it
    quietly, whichever command and wherever it was printing: no traceback."""
    try:
        code = _run(argv)
        sys.stdout.flush()   # inside the try: a pipe closed on the last lines is caught too
        return code
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's flush at exit has nowhere to fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED


def _run(argv: Sequence[str] | None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv and argv[0] in DAEMONS:
            _hide_from_tasks()
        parser, catalog = build_parser(argv[0] if argv else None)
        args = parser.parse_args(argv)
        lean = bool(argv) and argv[0] in LEAN   # a lean parser knows only its own keys
        catalog.check_file(everything=(lambda: build_parser()[1]) if lean else None)
        args.parser, args.catalog = parser, catalog   # for `config show`, which re-parses
        _setup_logging(args)
        if args.command in DAEMONS:
            _warn_about_passwords(argv, args, catalog)
        run: Command = args.run
        with reconnect.one_shot(args.command not in DAEMONS):  # a daemon keeps trying
            return run(args)
    except ConveyorError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return exit_code(exc)


def exit_code(exc: ConveyorError) -> int:
    """2 when the command itself needs correcting (a value, a name, a file); 1 when it was
    right but the world failed it (a broker unreachable or lost, a task that failed), so a
    script can tell "fix the command" from "try again later"."""
    if isinstance(exc, Refused):   # a server said no to the URL: fix the URL
        return 2
    return 1 if isinstance(exc, BrokerError | StateStoreUnavailable | ResultError) else 2
