"""Kinds: what a setting's text may be, each a function from the text to the value or a
ValueError saying what is allowed (`config` turns it into one line naming the setting).

Used by the settings table, the commands' own flags and the TOML files alike, so a value
means the same wherever it is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from conveyor.errors import ConfigError
from conveyor.locations import REDIS, scheme

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
    """A URL of the form scheme://[user[:password]@]host[:port]/…, or "" (the default);
    several `host[:port]` separated by commas are libpq's failover list (pgfailover.py), or
    the nodes of a RabbitMQ cluster (broker/rabbitmq/settings.py), or the Sentinels of a
    redis+sentinel:// URL (redis_clients.py)."""
    if not text:
        return text
    if "://" not in text:
        raise ValueError("must be a URL, e.g. redis://localhost:6379/0 or sqlite:///path.db")
    netloc = urlsplit(text).netloc
    for host in netloc.rsplit("@", 1)[-1].split(","):   # postgresql://h1:5432,h2:5433/db
        try:   # parsing the port: "host:notaport" fails here, not later
            if urlsplit(f"//{host}").port == 0:
                raise ValueError("port 0")
        except ValueError:
            raise ValueError(f"its port in {host!r} is not a number from 1 to 65535") from None
    _check_redis_db(text)
    return text


def _check_redis_db(text: str) -> None:
    """redis://host/N: the path is a database number (redis-py would fail at connect);
    redis+sentinel://hosts/master/N: the number comes after the master's name."""
    db = urlsplit(text).path.strip("/")
    if scheme(text) == "redis+sentinel":
        master, _, db = db.partition("/")
        if not master:
            raise ValueError("names no master: redis+sentinel://s1:26379,s2:26380/mymaster/0")
    if scheme(text) in (*REDIS, "kombu+redis") and db and not db.isdigit():
        raise ValueError(f"its database {db!r} is not a number (redis://host:6379/0)")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


#: What a worker's code version may be: it is part of a queue name (`<queue>@<version>`).
_CODE_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def code_version(text: str) -> str:
    """A worker's code version given by hand ('': derive it, worker/code_version.py)."""
    if text and not _CODE_VERSION.fullmatch(text):
        raise ValueError(f"{text!r} is not a code version: 1-64 letters, digits, '.', '_', "
                         "'+' or '-', starting with a letter or digit (e.g. a release "
                         "number or a git revision)")
    return text


def pinned_queue(queue: str, version: str) -> str:
    """The queue a worker of code `version` serves beside `queue`: where the scheduler sends
    the tasks of runs pinned to that version (README "Runs pinned to their code")."""
    return f"{queue}@{version}"


def is_pinned_queue(queue: str) -> bool:
    """Whether `queue` is a per-version queue (`pinned_queue`): '@' names one. RabbitMQ
    declares those to expire once unused (broker/rabbitmq/ladder.py); the scheduler
    publishes again what one held when its version's workers are all gone."""
    return "@" in queue


def queue_names(text: str) -> tuple[str, ...]:
    """Comma-separated queue names, at least one."""
    queues = tuple(q.strip() for q in text.split(",") if q.strip())
    if not queues:
        raise ConfigError("--queues needs at least one queue name, e.g. --queues=default,heavy")
    return queues


def names(text: str) -> tuple[str, ...]:
    """Comma-separated names, blanks dropped (modules, Celery queues); none is allowed."""
    return tuple(a.strip() for a in text.split(",") if a.strip())


def celery_canvas(text: str) -> str:
    """How the Celery intake runs chains and chords: auto, runs or follow."""
    value = text.strip().lower()
    if value not in ("auto", "runs", "follow"):
        raise ValueError("must be auto, runs or follow")
    return value


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
