"""Choosing the result store by URL (which URL, for a broker: `locations.store_urls`)."""

from __future__ import annotations

from conveyor.errors import ConfigError
from conveyor.locations import REDIS, redact, scheme
from conveyor.results.base import ResultStore


def from_url(url: str) -> ResultStore:
    """The store for `url`: redis://…, redis+sentinel://…, sqlite:///… or postgresql://…"""
    kind = scheme(url)
    if kind in REDIS:
        from conveyor.results.redis import RedisResults
        return RedisResults(url)
    if kind in ("sqlite", "postgresql", "postgres"):
        from conveyor.results.sql import SQLResults
        return SQLResults(url)
    raise ConfigError(f"result store URL {redact(url)!r} has an unknown scheme {kind!r}: use "
                      "redis://…, sqlite:///… or postgresql://… (CONVEYOR_RESULT_URL)")
