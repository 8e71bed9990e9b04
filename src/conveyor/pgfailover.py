"""Postgres with a standby: one URL naming every host, and connections that follow the primary.

`postgresql://h1:5432,h2:5433/db?target_session_attrs=read-write` is libpq's own multi-host
URL: libpq tries the hosts in order and keeps the first that accepts writes. Every module
that takes a Postgres URL (the broker, the state store, results, the limiter) passes it to
libpq whole, so the hosts and their ports are never parsed here (urllib's `.port` cannot
read `h1:5432,h2:5433`). Two things are Conveyor's:

* a URL naming several hosts connects with `target_session_attrs=read-write` unless it says
  otherwise (`with_failover_defaults`): a session opened on a standby could not write;
* a session that died, or that answers writes with SQLSTATE 25006 (read_only_sql_transaction:
  it is on a standby, e.g. the old primary came back as one), is lost
  (`is_connection_loss`): it is closed and a new one opened, which libpq places on whichever
  host is the primary now.
"""

from __future__ import annotations

from typing import Any

#: SQLSTATE of a write sent to a standby: the session must move to the primary.
READ_ONLY = "25006"
#: SQLSTATEs that mean the session is gone (the server sends them as it drops us): admin
#: shutdown, crash shutdown, cannot connect now (starting up, or shutting down).
SESSION_GONE = frozenset({"57P01", "57P02", "57P03", READ_ONLY})


def is_connection_loss(exc: BaseException) -> bool:
    """Whether `exc` means this session is no use any more (so a new one may help), not a bad
    query: the connection died, the server is going away, or it is a standby now."""
    import psycopg
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):   # an InternalError
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in SESSION_GONE


def several_hosts(params: dict[str, Any]) -> bool:
    """Whether libpq's parameters (`conninfo_to_dict`) name more than one host."""
    return "," in str(params.get("host") or "") or "," in str(params.get("hostaddr") or "")


def url_names_several_hosts(url: str) -> bool:
    """Whether a `postgresql://` URL names more than one host (before any parsing)."""
    netloc = url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0]
    return "," in netloc.rsplit("@", 1)[-1]


def with_failover_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with `target_session_attrs=read-write` when they name several hosts and do
    not choose: libpq's default (`any`) would keep a session on a standby."""
    if several_hosts(params) and "target_session_attrs" not in params:
        return {**params, "target_session_attrs": "read-write"}
    return params
