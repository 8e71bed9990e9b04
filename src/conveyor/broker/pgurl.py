"""What a Postgres broker URL says: libpq's parameters, and Conveyor's own options.

`postgresql://user@host:5432/db?schema=conveyor&ack_commit=async&retry_seconds=60`:
`schema`, `ack_commit`, `retry_seconds` and `vacuum_every` are Conveyor's (broker/postgres.py
says what each does) and are taken out; every other option goes to libpq. Every session the
broker opens gets the schema as its search_path and plans each statement afresh (_SESSION).

A URL naming several hosts (`postgresql://h1:5432,h2:5433/db`, a primary and its standby)
connects with `target_session_attrs=read-write` unless it says otherwise (pgfailover.py), and
its `ack_commit` defaults to `sync`: a failover undoes a commit that did not wait for the
flush, and an undone claim or ack runs a task again (broker/postgres.py, Durability).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from conveyor.broker import pgvacuum
from conveyor.broker.reconnect import DEPRECATED_RETRY_OPTION, RETRY_OPTION, retry_seconds
from conveyor.errors import ConfigError
from conveyor.locations import redact
from conveyor.pgfailover import url_names_several_hosts, with_failover_defaults

DEFAULT_SCHEMA = "conveyor"
#: Lowercase so it needs no quoting anywhere; short enough that `conveyor_<schema>` is a
#: valid NOTIFY channel (63 bytes at most).
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,53}")
_ACK_COMMITS = {"async": "ack_async", "sync": "ack"}
#: libpq settings that matter to a long-lived broker connection, unless the URL sets them:
#: fail a connect attempt in 10 s instead of never, and notice a dead peer in ~1 min.
_CONNECT_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30",
                     "keepalives_interval": "10", "keepalives_count": "3"}
#: Why custom plans: psycopg prepares a statement run 5 times, and Postgres may then keep
#: one generic plan for it. Made while the table was small (vacuumed with a page or two), the
#: claim's generic plan sorts a sequential scan of the table, and keeps doing so once
#: 100,000 rows arrive (nothing invalidates it until the next VACUUM or ANALYZE): 20 ms a
#: claim. A custom plan sees the table's current size and the claim's real LIMIT each time.
_SESSION = "-c plan_cache_mode=force_custom_plan"


@dataclass(frozen=True)
class PostgresSettings:
    """What a broker URL says: libpq parameters, plus Conveyor's own options."""

    params: dict[str, Any]
    schema: str
    ack_query: str
    retry_seconds: float
    vacuum_every: int


def parse_url(url: str) -> PostgresSettings:
    """`postgresql://…?schema=x&ack_commit=sync&…` -> PostgresSettings; ConfigError if invalid."""
    parts = urlsplit(url)
    options = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in options
           if k in ("schema", "ack_commit", "vacuum_every", RETRY_OPTION,
                    DEPRECATED_RETRY_OPTION)}
    failover = url_names_several_hosts(url)
    schema = own.get("schema", DEFAULT_SCHEMA)
    ack_commit = own.get("ack_commit", "sync" if failover else "async")
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(
            f"Postgres broker URL {redact(url)!r}: schema {schema!r} is not allowed; use "
            "lowercase letters, digits and _ (not first), at most 54 characters")
    if ack_commit not in _ACK_COMMITS:
        raise ConfigError(f"Postgres broker URL {redact(url)!r}: ack_commit={ack_commit!r}; "
                          "use ack_commit=async (the default on one host) or ack_commit=sync "
                          "(the default with several hosts)")
    rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in options
                                                      if k not in own], quote_via=quote)))
    try:
        params = conninfo_to_dict(rest)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"Postgres broker URL {redact(url)!r} is not valid: {exc}") from exc
    # Tables are unqualified in the SQL: the schema is every session's search_path. Each
    # execution of a statement is planned for the table as it is then (see _SESSION).
    params["options"] = f"{params.get('options', '')} -c search_path={schema} {_SESSION}".strip()
    return PostgresSettings(with_failover_defaults({**_CONNECT_DEFAULTS, **params}), schema,
                            _ACK_COMMITS[ack_commit], retry_seconds(own, url),
                            _vacuum_every(own, url))


def _vacuum_every(options: dict[str, str], url: str) -> int:
    """`?vacuum_every=N`: claims between a consumer's vacuums of the queue table (0: never)."""
    raw = options.get("vacuum_every", str(pgvacuum.DEFAULT_EVERY))
    if not raw.isdigit():
        raise ConfigError(f"Postgres broker URL {redact(url)!r}: vacuum_every={raw!r}; use a "
                          "whole number of claims, or 0 to leave vacuuming to autovacuum")
    return int(raw)
