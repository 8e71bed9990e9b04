"""Settings read in one place, into typed, validated values.

Precedence everywhere: flags > `CONVEYOR_*` environment > a TOML file > defaults.

* Every setting is a row of one table (`conveyor.settings_table`): its variable, file key,
  flags, default, kind and help. `read` gives a row's value; `env_flag(parser, env=...)`
  adds a row's flag to a command and records it in the parser's `Catalog` (what `conveyor
  config show` prints and the README's configuration reference is generated from).
  `conveyor.cli.build_parser` returns the catalog with the parser it fills.
* The TOML file is `$CONVEYOR_CONFIG_FILE` if set (it must exist), else `./conveyor.toml`,
  else `conveyor.toml` in the data directory ($CONVEYOR_HOME). Its keys are the variables'
  names without `CONVEYOR_`, lower-cased: `CONVEYOR_BROKER_URL` -> `broker_url`.
* A wrong value stops the program at start with one line naming the key, the value and
  what is allowed; so does a key in the file that no setting has (a misspelling must not
  silently leave a default in place).

Nothing reads the environment at import time; `read()` and the parser do it when a command
starts.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NoReturn

from conveyor.errors import ConfigError
from conveyor.locations import StoreURLs, data_dir, redact, store_urls
from conveyor.message import DEFAULT_MAX_BYTES
from conveyor.settings_table import FILE_VARIABLE as FILE_VARIABLE
from conveyor.settings_table import ROWS

PREFIX = "CONVEYOR_"
_SECRET = ("KEY", "PASSWORD", "SECRET", "TOKEN")


# -- the file --------------------------------------------------------------------------------

def key_name(env: str) -> str:
    """The TOML key of a variable: CONVEYOR_BROKER_URL -> broker_url."""
    return env.removeprefix(PREFIX).lower()


def config_file(env: Mapping[str, str] | None = None) -> Path | None:
    """The TOML file in effect, if any (see the module docstring for where it is looked for)."""
    env = os.environ if env is None else env
    explicit = env.get(FILE_VARIABLE)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{FILE_VARIABLE}={explicit!r}: no such file; create it or "
                              "unset the variable")
        return path
    for candidate in (Path("conveyor.toml"), data_dir() / "conveyor.toml"):
        if _is_file(candidate):
            return candidate
    return None


def _is_file(candidate: Path) -> bool:
    """Whether the file exists; one line if this user may not even look (HOME of another)."""
    try:
        return candidate.is_file()
    except PermissionError:
        raise ConfigError(f"cannot look for {candidate}: permission denied for uid "
                          f"{os.getuid()}; set CONVEYOR_HOME (or HOME) to a directory this "
                          f"user can read") from None


_FILES: dict[tuple[str, float], dict[str, Any]] = {}


def file_values(path: Path | None) -> dict[str, Any]:
    """The file's keys and values, read once per version of the file."""
    if path is None:
        return {}
    cache_key = (str(path.resolve()), path.stat().st_mtime)
    if cache_key not in _FILES:
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        nested = sorted(k for k, v in data.items() if isinstance(v, dict))
        if nested:
            raise ConfigError(f"{path}: [{nested[0]}] is a table; this file takes top-level "
                              "keys only, e.g. broker_url = \"redis://…\"")
        _FILES[cache_key] = data
    return _FILES[cache_key]


def _text(value: Any) -> str:
    """A TOML value as the text a flag or variable would hold (lists comma-joined)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def lookup(env_name: str, env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(raw text, where it came from) for a variable: the environment, then the file.

    With an explicit `env` mapping the file is not read: callers (tests) that pass one want
    exactly those values.
    """
    source_env = os.environ if env is None else env
    if env_name in source_env:
        return source_env[env_name], "env"
    if env is None:
        path = config_file()
        values = file_values(path)
        if key_name(env_name) in values:
            return _text(values[key_name(env_name)]), f"file {path}"
    return None, "default"


def _where(env_name: str, source: str) -> str:
    """How an error names the key: the variable, or file:key."""
    if source.startswith("file "):
        return f"{source[5:]}: {key_name(env_name)}"
    return env_name


# -- the catalog of settings -----------------------------------------------------------------

@dataclass(frozen=True)
class Renamed:
    """An old spelling (flag, variable, file key) of a setting: it keeps working, with one
    deprecation line on stderr, unless `refuse` says the value meant something else there."""

    flag: str
    env: str
    #: a reason to refuse a value under the old name (it meant something else), or None
    refuse: Callable[[str], str | None] = lambda raw: None

    def accept(self, where: str, raw: str, new: str) -> None:
        """Refuse a value the old name meant differently; else warn once that it is old."""
        reason = self.refuse(raw)
        if reason:
            raise ConfigError(f"{where}={raw!r}: {reason}")
        print(f"conveyor: {where} is deprecated, use {new} (same meaning)", file=sys.stderr)


@dataclass
class Key:
    """One setting: its variable, its flags, its default, and the commands that take it."""

    env: str
    default: Any = None
    help: str = ""
    flags: tuple[str, ...] = ()
    dest: str = ""
    commands: list[str] = field(default_factory=list)
    convert: Callable[[str], Any] | None = None
    #: command -> its default, where commands sharing the setting differ
    defaults: dict[str, Any] = field(default_factory=dict)
    #: command -> its flags (`ui --port` is `up --ui-port`, beside up's own --metrics-port)
    flags_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the setting's old spelling, still accepted with a deprecation line
    renamed: Renamed | None = None
    #: False: read from the environment only, never from the file (where the file is)
    in_file: bool = True

    @property
    def name(self) -> str:
        return key_name(self.env)

    @property
    def secret(self) -> bool:
        return any(word in self.env for word in _SECRET)


class Catalog(dict[str, Key]):
    """Every setting, by variable: filled as commands declare their flags (and by `Settings`)."""

    def declare(self, env: str, *, default: Any = None, help: str = "",
                flags: tuple[str, ...] = (), dest: str = "", command: str = "",
                convert: Callable[[str], Any] | None = None) -> Key:
        """Record a setting (several commands may share one variable)."""
        key = self.setdefault(env, Key(env, default, help, flags, dest, convert=convert))
        if not key.flags and flags:
            key.flags, key.dest = flags, dest
        if command and command not in key.commands:
            key.commands.append(command)
            key.defaults[command] = default
            key.flags_of[command] = flags
        return key

    def declare_settings(self) -> None:
        """Put the table's settings in the catalog (commands' flags add theirs as they
        register), and check their values now: a bad one stops the command before it starts
        anything."""
        for row in ROWS.values():
            key = self.declare(row.env, default=row.default, help=row.help,
                               convert=None if row.kind is bool else row.kind)
            key.in_file, key.commands = row.in_file, list(row.commands)
            if row.checked_everywhere:
                read(row.env)

    def check_file(self, everything: Callable[[], Catalog] | None = None) -> None:
        """Stop if the file names a key no setting has (call after every flag is declared).

        `everything`: the whole catalog, for a parser that declared only its own command's
        settings (the worker's lean one): a key it does not know may be another command's
        (one file serves them all), so the whole catalog is asked before refusing it.
        """
        path = config_file()
        unknown = self._unknown(file_values(path))
        if unknown and everything is not None:
            unknown = everything()._unknown(unknown)
        for name, value in unknown.items():
            env_only = self.get(f"{PREFIX}{name.upper()}")
            if env_only is not None:
                raise ConfigError(f"{path}: {name} is read from the environment only: set "
                                  f"{env_only.env} instead")
            raise ConfigError(f"{path}: {name} = {value!r} is not a setting (misspelt?); "
                              "`conveyor config show` lists them all")

    def _unknown(self, values: dict[str, Any]) -> dict[str, Any]:
        """The file's keys that no setting of this catalog has (nor had, renamed)."""
        known = {key.name for key in self.values() if key.in_file} | {
            key_name(key.renamed.env) for key in self.values() if key.renamed}
        return {name: value for name, value in values.items() if name not in known}


class SettingsParser(argparse.ArgumentParser):
    """A parser whose flags, and its sub-commands' flags, are recorded in one `Catalog`."""

    def __init__(self, *args: Any, catalog: Catalog | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.catalog = Catalog() if catalog is None else catalog
        # A word that starts like a negative number (-5MiB, -1.5s) is a value, not a flag:
        # argparse only knows bare numbers, and `--memory-limit -5MiB` said "expected one
        # argument" instead of why -5MiB is refused. No flag of ours starts with a digit.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(SettingsParser,
                                                            catalog=self.catalog))
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:
        """Bad input is one line (not the whole usage): what is wrong, and where to look."""
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def passwords_in_argv(argv: Sequence[str], args: argparse.Namespace,
                      catalog: Catalog) -> list[Key]:
    """The settings whose value on this command line holds a password (a URL's): argv is
    /proc/<pid>/cmdline, which any process of the host may read (tasks too, whatever their
    uid), for as long as the command runs."""
    given = {word.split("=", 1)[-1] if word.startswith("--") else word for word in argv}
    found = []
    for key in catalog.values():
        value = getattr(args, key.dest, None) if key.dest else None
        if isinstance(value, str) and value in given and redact(value) != value:
            found.append(key)
    return found


def shown(key: Key, value: Any) -> str:
    """A value as people read it, secrets masked."""
    if value is None or value == "":
        return ""
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    text = str(value)
    if key.secret:
        return "***"
    if "://" in text:   # any URL may carry a password (broker, state, result backend)
        return redact(text)
    return text


# -- shared settings -------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """What every component needs to reach the broker and trust its messages."""

    broker_url: str = ""
    state_url: str = ""
    signing_key: str = ""
    max_message_bytes: int = DEFAULT_MAX_BYTES
    result_url: str = ""
    result_ttl: float = 86400.0
    result_max_bytes: int = DEFAULT_MAX_BYTES
    limits_url: str = ""
    tracing: str = "off"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Overrides (flags) > environment > file > defaults."""
        values = {f.name: read(f"{PREFIX}{f.name.upper()}", env) for f in fields(cls)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **{k: v for k, v in values.items() if v is not None})

    def stores(self) -> StoreURLs:
        """Every store's URL, resolved once from these settings (`locations.store_urls`)."""
        return store_urls(self.broker_url, self.state_url, self.result_url, self.limits_url)

    def codec(self) -> Any:
        from conveyor.message import Codec
        return Codec(self.signing_key or None, self.max_message_bytes)


def _allowed(exc: Exception) -> str:
    """What a conversion error means for the person who wrote the value."""
    text = str(exc)
    if text.startswith("invalid literal for int()"):
        return "must be a whole number"
    if text.startswith("could not convert string to float"):
        return "must be a number"
    return text


# -- kinds: what a setting's text may be ---------------------------------------------------

# -- reading the table ----------------------------------------------------------------------

def read(env_name: str, env: Mapping[str, str] | None = None) -> Any:
    """A table setting's value from the environment, else the file (None: neither), checked:
    a wrong one is one line naming the variable or file key, the value and what is allowed.
    With an explicit `env` mapping only those values count (see `lookup`)."""
    row = ROWS[env_name]
    if not row.in_file:
        return (os.environ if env is None else env).get(env_name)
    raw, source = lookup(env_name, env)
    return None if raw is None else _checked_value(raw, row.kind, _where(env_name, source))


# -- flags -----------------------------------------------------------------------------------

def env_flag(parser: Any, *, env: str, renamed: Renamed | None = None, **kwargs: Any) -> None:
    """Add the flag of the table's setting `env` (`settings_table.ROWS`), as this command
    spells it; its default comes from `env`, then the file, then the row.

    The variable is named in --help, the setting is recorded in the parser's catalog (a
    `SettingsParser`; a plain parser records nothing), and a bad value, on the command line,
    in the environment or in the file, stops the program with one line naming the setting,
    the value and what is allowed. `renamed`: the old spelling, still accepted.
    """
    if env not in ROWS:
        raise TypeError(f"{env} is not a setting: add its row to settings_table")
    command = parser.prog.removeprefix("conveyor ").strip()
    names, default, kind, help = ROWS[env].spelled(command)
    value = _from_environment(env, default, kind, renamed, names[-1])
    shown_default = f"; default: {default}" if default not in (None, "", False, ()) else ""
    text = f"{help} [env: {env}{shown_default}]"
    if kind is bool:
        action = parser.add_argument(*names, action="store_true", default=value, help=text,
                                     **kwargs)
    else:
        action = parser.add_argument(*names, type=checked(kind), default=value, help=text,
                                     **kwargs)
    if renamed is not None:
        parser.add_argument(renamed.flag, dest=action.dest, default=argparse.SUPPRESS,
                            type=_old_spelling(renamed, kind, names[-1]), help=argparse.SUPPRESS)
    catalog = getattr(parser, "catalog", None)
    if catalog is not None:
        key = catalog.declare(env, default=default, help=help,
                              flags=tuple(n for n in names if n.startswith("--")),
                              dest=action.dest, command=command,
                              convert=None if kind is bool else kind)
        key.renamed = renamed


def _from_environment(env: str, default: Any, kind: Any, renamed: Renamed | None,
                      flag: str) -> Any:
    """The value the environment or the file gives (the old spelling too), else `default`."""
    raw, source = lookup(env)
    where = _where(env, source)
    if raw is None and renamed is not None:
        raw, source = lookup(renamed.env)
        where = _where(renamed.env, source)
        if raw is not None:
            renamed.accept(where, raw, key_name(env) if source.startswith("file ") else env)
    if raw is None:
        return default
    if kind is bool:
        return raw.lower() in ("1", "true", "yes", "on")
    return _checked_value(raw, kind, where)


def _checked_value(raw: str, kind: Callable[[str], Any], where: str) -> Any:
    """`raw` as `kind` has it, or one line naming `where`, the value and what is allowed."""
    try:
        return kind(raw)
    except (ValueError, ConfigError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{where}={_safe(raw)!r} is not allowed: {_allowed(exc)}") from None


def _safe(raw: str) -> str:
    """A value fit for an error message: a URL's password masked."""
    return redact(raw) if "://" in raw else raw


def checked(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """`kind` for argparse: any refusal becomes one line naming the value and what is allowed
    (argparse adds the flag's name)."""
    def convert(raw: str) -> Any:
        try:
            return kind(raw)
        except (ValueError, ConfigError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"{_safe(raw)!r} is not allowed: "
                                             f"{_allowed(exc)}") from None
    convert.__name__ = getattr(kind, "__name__", "value")
    return convert


def _old_spelling(renamed: Renamed, kind: Callable[[str], Any],
                  new: str) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            renamed.accept(renamed.flag, raw, new)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None
        return checked(kind)(raw)
    return convert
