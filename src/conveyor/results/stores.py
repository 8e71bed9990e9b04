"""Choosing the result store: by URL, and the default URL for a broker."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor.config import Settings
from conveyor.errors import ConfigError
from conveyor.locations import path_from_url, redact
from conveyor.results.base import ResultStore


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def url_for(settings: Settings) -> str:
    """The result store URL: CONVEYOR_RESULT_URL if set, else by broker: Redis keeps them
    beside the queues (keys with a TTL), a SQLite broker in `results.db` beside its file,
    Postgres in the broker's database; others in the state store (CONVEYOR_STATE_URL)."""
    if settings.result_url:
        return settings.result_url
    broker_url = settings.broker_url or default_broker_url()
    scheme = _scheme(broker_url)
    if scheme in ("redis", "rediss"):
        return broker_url
    if scheme == "sqlite":
        return _beside(broker_url, "results.db")
    if scheme in ("postgresql", "postgres"):
        return _without(broker_url, "ack_commit")
    if settings.state_url:
        return settings.state_url
    from conveyor.state.store import default_url
    return default_url()


def default_broker_url() -> str:
    from conveyor.broker import default_url
    return default_url()


def _beside(url: str, name: str) -> str:
    """The SQLite URL of file `name` in the directory of `url`'s file (its options dropped)."""
    return f"sqlite://{path_from_url(url)[0].parent / name}"


def _without(url: str, option: str) -> str:
    """`url` without one query option (a broker's own, that libpq would refuse)."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != option]
    return urlunsplit(parts._replace(query=urlencode(kept)))


def from_url(url: str) -> ResultStore:
    """The store for `url`: redis://…, sqlite:///… or postgresql://…"""
    scheme = _scheme(url)
    if scheme in ("redis", "rediss"):
        from conveyor.results.redis import RedisResults
        return RedisResults(url)
    if scheme in ("sqlite", "postgresql", "postgres"):
        from conveyor.results.sql import SQLResults
        return SQLResults(url)
    raise ConfigError(f"result store URL {redact(url)!r} has an unknown scheme {scheme!r}: use "
                      "redis://…, sqlite:///… or postgresql://… (CONVEYOR_RESULT_URL)")
