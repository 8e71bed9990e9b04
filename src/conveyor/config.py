"""Settings read in one place, into typed, validated values.

Precedence everywhere: flags > `CONVEYOR_*` environment > a TOML file > defaults.

* Every CLI flag is declared with `env_flag`, which resolves its default from the
  environment, then the file, and records the setting in its parser's `Catalog` (what
  `conveyor config show` prints and what the README's configuration reference is generated
  from). `conveyor.cli.build_parser` returns the catalog with the parser it fills.
* The TOML file is `$CONVEYOR_CONFIG_FILE` if set (it must exist), else `./conveyor.toml`,
  else `conveyor.toml` in the data directory ($CONVEYOR_HOME). Its keys are the variables'
  names without `CONVEYOR_`, lower-cased: `CONVEYOR_BROKER_URL` -> `broker_url`.
* A wrong value stops the program at start with one line naming the key, the value and
  what is allowed; so does a key in the file that no setting has (a misspelling must not
  silently leave a default in place).

Nothing reads the environment at import time; `Settings.from_env()` and the parser do it
when a command starts.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from conveyor.errors import ConfigError
from conveyor.locations import data_dir, redact
from conveyor.message import DEFAULT_MAX_BYTES
from conveyor.tracing import mode as tracing_mode

PREFIX = "CONVEYOR_"
FILE_VARIABLE = "CONVEYOR_CONFIG_FILE"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 1000**2, "MB": 1000**2,
          "MIB": 1024**2, "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "T": 1000**4,
          "TB": 1000**4, "TIB": 1024**4}
_SECRET = ("KEY", "PASSWORD", "SECRET", "TOKEN")


def parse_size(text: str | int, key: str = "size") -> int:
    """'2GiB' -> 2147483648; '512M' -> 512000000; plain numbers are bytes."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"{key}={text!r} is not a size: use bytes or a unit, e.g. 512MiB, 2GiB")
    return int(float(match.group(1)) * _UNITS[unit])


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
    #: the setting's old spelling, still accepted with a deprecation line
    renamed: Renamed | None = None

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
        return key

    def declare_settings(self) -> None:
        """Put the `Settings` fields in the catalog (they are read by every command), and
        check their values now: a bad one stops the command before it starts anything."""
        for f in fields(Settings):
            env, kind = f"{PREFIX}{f.name.upper()}", SETTINGS_KINDS.get(f.name, str)
            self.declare(env, default=f.default, help=SETTINGS_HELP[f.name], convert=kind)
            _from_environment(env, f.default, kind, None, "")

    def check_file(self) -> None:
        """Stop if the file names a key no setting has (call after every flag is declared)."""
        path = config_file()
        known = {key.name for key in self.values()} | {
            key_name(key.renamed.env) for key in self.values() if key.renamed}
        for name, value in file_values(path).items():
            if name not in known:
                raise ConfigError(f"{path}: {name} = {value!r} is not a setting (misspelt?); "
                                  "`conveyor config show` lists them all")


class SettingsParser(argparse.ArgumentParser):
    """A parser whose flags, and its sub-commands' flags, are recorded in one `Catalog`."""

    def __init__(self, *args: Any, catalog: Catalog | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.catalog = Catalog() if catalog is None else catalog

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", functools.partial(SettingsParser,
                                                            catalog=self.catalog))
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:
        """Bad input is one line (not the whole usage): what is wrong, and where to look."""
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


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
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = f"{PREFIX}{f.name.upper()}"
            raw, source = lookup(var, env)
            if raw is not None:
                values[f.name] = _converted(raw, f.type, _where(var, source))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def codec(self) -> Any:
        from conveyor.message import Codec
        return Codec(self.signing_key or None, self.max_message_bytes)


def _converted(raw: str, kind: Any, where: str) -> Any:
    """A setting's text as its field's type: sizes for ints, seconds for floats."""
    if kind in ("int", int):
        return parse_size(raw, where)
    if kind in ("float", float):
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value <= 0:
            raise ConfigError(f"{where}={raw!r} is not allowed: must be a positive number "
                              "of seconds")
        return value
    return raw


SETTINGS_HELP = {
    "broker_url": "broker URL: sqlite:///…, redis://…, amqp://…, postgresql://…, "
                  "kombu+<transport>://… (default: the embedded SQLite file)",
    "state_url": "scheduler state store URL: sqlite:///… or postgresql://… (default: "
                 "scheduler.db in the data directory)",
    "signing_key": "HMAC key: messages are signed, and unsigned ones dead-lettered",
    "max_message_bytes": "largest message accepted; bigger ones are dead-lettered",
    "result_url": "where task results are kept: redis://…, sqlite:///… or postgresql://… "
                  "(default: the broker's Redis, else the state store)",
    "result_ttl": "seconds a stored task result is kept",
    "result_max_bytes": "largest task result stored; a task returning more fails",
    "limits_url": "where flow-control limits are kept: redis://…, sqlite:///… or "
                  "postgresql://… (default: the broker unless it is RabbitMQ or kombu, then "
                  "the state store)",
    "tracing": "OpenTelemetry traces (needs conveyor[otel]): off, console, otlp (to "
               "OTEL_EXPORTER_OTLP_ENDPOINT), or module:callable returning an exporter",
}


def _allowed(exc: Exception) -> str:
    """What a conversion error means for the person who wrote the value."""
    text = str(exc)
    if text.startswith("invalid literal for int()"):
        return "must be a whole number"
    if text.startswith("could not convert string to float"):
        return "must be a number"
    return text


# -- kinds: what a setting's text may be ---------------------------------------------------

def _number(text: str, kind: type[int] | type[float], ok: Callable[[Any], bool],
            allowed: str) -> Any:
    """`text` as a number that `ok` accepts, or a ValueError saying what is `allowed`."""
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"must be {allowed}") from None
    if not ok(value):
        raise ValueError(f"must be {allowed}")
    return value


def positive_int(text: str) -> int:
    """A whole number, 1 or more (slots, counts)."""
    return int(_number(text, int, lambda v: v >= 1, "a whole number, 1 or more"))


def non_negative_int(text: str) -> int:
    """A whole number, 0 or more (priorities, retries)."""
    return int(_number(text, int, lambda v: v >= 0, "a whole number, 0 or more"))


def seconds(text: str) -> float:
    """A duration in seconds, 0 or more (0 usually means none; nan and inf are refused)."""
    return float(_number(text, float, lambda v: 0 <= v < float("inf"),
                         "a number of seconds, 0 or more"))


def positive_seconds(text: str) -> float:
    """A duration in seconds, more than 0 (intervals: 0 would spin)."""
    return float(_number(text, float, lambda v: 0 < v < float("inf"),
                         "a number of seconds, more than 0"))


def port(text: str) -> int:
    """A TCP port, or 0 for off."""
    return int(_number(text, int, lambda v: 0 <= v <= 65535,
                       "a port number, 1 to 65535 (0: off)"))


def url(text: str) -> str:
    """A URL of the form scheme://[user[:password]@]host[:port]/…, or "" (the default)."""
    if not text:
        return text
    if "://" not in text:
        raise ValueError("must be a URL, e.g. redis://localhost:6379/0 or sqlite:///path.db")
    try:
        if urlsplit(text).port == 0:   # parsing the port: "host:notaport" fails here, not later
            raise ValueError("port 0")
    except ValueError:
        netloc = urlsplit(text).netloc.rsplit("@", 1)[-1]
        raise ValueError(f"its port in {netloc!r} is not a number from 1 to 65535") from None
    _check_redis_db(text)
    return text


def _check_redis_db(text: str) -> None:
    """redis://host/N: the path is a database number (redis-py would fail at connect)."""
    parts = urlsplit(text)
    db = parts.path.strip("/")
    if parts.scheme in ("redis", "rediss", "kombu+redis") and db and not db.isdigit():
        raise ValueError(f"its database {db!r} is not a number (redis://host:6379/0)")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """A logging level name, any case."""
    if text.upper() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def size(text: str) -> int:
    """A size in bytes, or with a unit: 512MiB, 2GiB."""
    try:
        return parse_size(text)
    except ConfigError:
        raise ValueError("must be a size: bytes, or a number with a unit, e.g. 512MiB, "
                         "2GiB") from None


#: What each `Settings` field may be (the others are free text).
SETTINGS_KINDS: dict[str, Callable[[str], Any]] = {
    "broker_url": url, "state_url": url, "result_url": url, "limits_url": url,
    "max_message_bytes": size,
    "result_max_bytes": size, "result_ttl": positive_seconds, "tracing": tracing_mode,
}


# -- flags -----------------------------------------------------------------------------------

def env_flag(parser: Any, *names: str, env: str, default: Any = None, kind: Any = str,
             help: str = "", renamed: Renamed | None = None, **kwargs: Any) -> None:
    """Add a flag whose default comes from `env`, then the file, then `default`.

    The variable is named in --help, the setting is recorded in the parser's catalog (a
    `SettingsParser`; a plain parser records nothing), and a bad value, on the command line,
    in the environment or in the file, stops the program with one line naming the setting,
    the value and what is allowed. `renamed`: the old spelling, still accepted.
    """
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
                              dest=action.dest,
                              command=parser.prog.removeprefix("conveyor ").strip(),
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
    try:
        return kind(raw) if kind is not bool else raw.lower() in ("1", "true", "yes", "on")
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
