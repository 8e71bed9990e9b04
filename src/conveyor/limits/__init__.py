"""Flow control's store: global concurrency and rate limits (`Limiter`), one backend per
store where the state can be atomic, chosen by URL.

Which store (`locations.store_urls` decides): `limits_url` if set; else the broker when it
is Redis, Postgres or SQLite (one place to run, and the limiter's writes share its connection
limits and backups); else (a RabbitMQ or kombu broker) the state store. `conveyor.flow` has
what tasks declare.
"""

from __future__ import annotations

from conveyor.errors import ConfigError
from conveyor.limits.base import Decision, Limiter, Override, Parcel, Usage
from conveyor.locations import redact, scheme

# URL scheme -> "module:Class"
BACKENDS = {
    "redis": "conveyor.limits.redis:RedisLimiter",
    "rediss": "conveyor.limits.redis:RedisLimiter",
    "redis+sentinel": "conveyor.limits.redis:RedisLimiter",
    "postgresql": "conveyor.limits.sql:PostgresLimiter",
    "postgres": "conveyor.limits.sql:PostgresLimiter",
    "sqlite": "conveyor.limits.sql:SQLiteLimiter",
}


def from_url(url: str) -> Limiter:
    """The limiter whose state lives at `url`."""
    import importlib
    target = BACKENDS.get(scheme(url))
    if target is None:
        raise ConfigError(f"limits URL {redact(url)!r} has scheme {scheme(url)!r}, where "
                          "limits cannot be kept atomically: use redis://, postgresql:// or "
                          "sqlite:/// (CONVEYOR_LIMITS_URL)")
    module_name, class_name = target.split(":")
    limiter: Limiter = getattr(importlib.import_module(module_name), class_name)(url)
    return limiter


__all__ = ["BACKENDS", "Decision", "Limiter", "Override", "Parcel", "Usage", "from_url"]
