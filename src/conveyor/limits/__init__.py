"""Flow control's store: global concurrency and rate limits (`Limiter`), one backend per
store where the state can be atomic, chosen by URL.

Which store: `limits_url` if set; else the broker when it is Redis, Postgres or SQLite (one
place to run, and the limiter's writes share its connection limits and backups); else (a
RabbitMQ or kombu broker) the state store. `conveyor.flow` has what tasks declare.
"""

from __future__ import annotations

from conveyor.errors import ConfigError
from conveyor.limits.base import Decision, Limiter, Override, Parcel, Usage
from conveyor.locations import data_dir, redact

# URL scheme -> "module:Class"
BACKENDS = {
    "redis": "conveyor.limits.redis:RedisLimiter",
    "rediss": "conveyor.limits.redis:RedisLimiter",
    "postgresql": "conveyor.limits.sql:PostgresLimiter",
    "postgres": "conveyor.limits.sql:PostgresLimiter",
    "sqlite": "conveyor.limits.sql:SQLiteLimiter",
}


def url_for(broker_url: str, state_url: str, limits_url: str = "") -> str:
    """The limiter's store for these settings (see the module docstring)."""
    if limits_url:
        return limits_url
    if not broker_url:
        return f"sqlite:///{data_dir() / 'conveyor.db'}"  # the embedded broker's file
    if _scheme(broker_url) in ("postgresql", "postgres"):
        return _shared_postgres(broker_url)
    if _scheme(broker_url) in BACKENDS:
        return broker_url
    return state_url or f"sqlite:///{data_dir() / 'scheduler.db'}"


def _shared_postgres(broker_url: str) -> str:
    """The broker's Postgres URL for the limiter: its commits are asynchronous when the
    broker's acks are (see `PostgresLimiter`)."""
    if "ack_commit=sync" in broker_url:
        return broker_url
    return broker_url + ("&" if "?" in broker_url else "?") + "commit=async"


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def from_url(url: str) -> Limiter:
    """The limiter whose state lives at `url`."""
    import importlib
    target = BACKENDS.get(_scheme(url))
    if target is None:
        raise ConfigError(f"limits URL {redact(url)!r} has scheme {_scheme(url)!r}, where "
                          "limits cannot be kept atomically: use redis://, postgresql:// or "
                          "sqlite:/// (CONVEYOR_LIMITS_URL)")
    module_name, class_name = target.split(":")
    limiter: Limiter = getattr(importlib.import_module(module_name), class_name)(url)
    return limiter


__all__ = ["BACKENDS", "Decision", "Limiter", "Override", "Parcel", "Usage", "from_url",
           "url_for"]
