"""Settings read in one place, into a typed, frozen dataclass.

Precedence everywhere: explicit arguments (flags) > `CONVEYOR_*` environment > defaults.
Nothing reads the environment at import time; call `Settings.from_env()` when starting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from conveyor.errors import ConfigError
from conveyor.message import DEFAULT_MAX_BYTES

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 1000**2, "MB": 1000**2,
          "MIB": 1024**2, "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "T": 1000**4,
          "TB": 1000**4, "TIB": 1024**4}


def parse_size(text: str | int, key: str = "size") -> int:
    """'2GiB' -> 2147483648; '512M' -> 512000000; plain numbers are bytes."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"{key}={text!r} is not a size: use bytes or a unit, e.g. 512MiB, 2GiB")
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Settings:
    """What every component needs to reach the broker and trust its messages."""

    broker_url: str = ""
    state_url: str = ""
    signing_key: str = ""
    max_message_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"CONVEYOR_{f.name.upper()}")
            if raw is not None:
                values[f.name] = parse_size(raw, f"CONVEYOR_{f.name.upper()}") \
                    if f.type in ("int", int) else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def codec(self) -> Any:
        from conveyor.message import Codec
        return Codec(self.signing_key or None, self.max_message_bytes)


def env_flag(parser: Any, *names: str, env: str, default: Any = None, kind: Any = str,
             help: str = "", **kwargs: Any) -> None:
    """Add a flag whose default comes from `env` (flags > CONVEYOR_* environment > default).

    The variable is named in --help, and a bad value in the environment stops the program
    with one line naming the variable, the value and what is allowed.
    """
    raw = os.environ.get(env)
    value = default
    if raw is not None:
        try:
            value = kind(raw) if kind is not bool else raw.lower() in ("1", "true", "yes", "on")
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{env}={raw!r} is not allowed: {exc}") from None
    shown = f" [env: {env}" + (f"; default: {default}" if default not in (None, "", False)
                               else "") + "]"
    if kind is bool:
        parser.add_argument(*names, action="store_true", default=value, help=help + shown,
                            **kwargs)
    else:
        parser.add_argument(*names, type=kind, default=value, help=help + shown, **kwargs)
