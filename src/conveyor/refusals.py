"""What a server's answer means when a client first reaches it: one wording for every client.

The broker transports, the limits stores and the state store all open connections to the
same kinds of servers. When a first contact fails with an answer that retrying cannot change
(a login refused, a database that does not exist, a port where another kind of server
listens), each says so the same way: what the server said, and what to fix. An outage is not
such an answer: these return None for it, and the caller retries or reports it unreachable
(`broker/reconnect.py`). The client libraries are imported only by the function that needs
its own.
"""

from __future__ import annotations

from typing import Any

from conveyor.errors import BrokerConnectionError, BrokerError, Refused, one_line

ANOTHER_SERVICE = "is another service on that port? fix the host and port in the URL"


def redis(exc: BaseException) -> str | None:
    """A Redis client's error at the first contact, if retrying would not help."""
    from redis.exceptions import (
        AuthenticationError,
        AuthorizationError,
        InvalidResponse,
        ResponseError,
    )

    from conveyor.redis_clients import UnknownMaster
    if isinstance(exc, UnknownMaster):
        return f"has no such master ({one_line(exc)})"
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return (f"refused this client ({one_line(exc)}): fix the user, password or ACL in "
                "the URL")
    if isinstance(exc, InvalidResponse):
        return f"answered, but not as Redis does ({one_line(exc)}): {ANOTHER_SERVICE}"
    if isinstance(exc, ResponseError):
        return f"refused to set up the connection ({one_line(exc)}): check the URL"
    return None


def rabbitmq(exc: BaseException) -> str | None:
    """A pika connection error at the first contact, if retrying would not help (a refused
    login is the transport's own: pika cannot always tell it from a cut handshake)."""
    from pika.exceptions import IncompatibleProtocolError
    if isinstance(exc, IncompatibleProtocolError):
        return f"answered, but not as RabbitMQ does ({one_line(exc)}): {ANOTHER_SERVICE}"
    return None


def kombu(exc: BaseException) -> str | None:
    """A kombu connection error, if retrying would not help: kombu wraps its transport
    client's error (redis-py's refused login or garbled answer) in its OperationalError."""
    cause = exc.__cause__ or exc.__context__
    return redis(cause) if cause is not None else None


#: What libpq says when the server answered and said no, or is not Postgres (an outage reads
#: "Connection refused", "timeout", "starting up").
_POSTGRES = (
    ("does not exist", "refused the connection", "create it, or fix the URL"),  # db, role
    ("password authentication failed", "refused the login",
     "fix the user or password in the URL"),
    ("no pg_hba.conf entry", "refused the login",
     "allow this host and user in pg_hba.conf, or fix the URL"),
    ("not permitted to log in", "refused the login", "fix the user in the URL"),
    ("invalid response to SSL negotiation", "answered, but not as Postgres does",
     ANOTHER_SERVICE),
    ("expected authentication request", "answered, but not as Postgres does", ANOTHER_SERVICE),
)


def postgres(exc: BaseException) -> str | None:
    """A libpq connection error, if retrying would not help."""
    text = " ".join(str(exc).split())   # libpq's messages span lines
    for words, said, advice in _POSTGRES:
        if words in text:
            return f"{said} ({text}): {advice}"
    return None


def first_redis_contact(client: Any, where: str) -> None:
    """PING `client` (a redis-py client that connects lazily) once, so that a refusal or an
    outage is one line naming `where` ("the limits store: Redis at redis://…") now, not a
    library traceback at its first real call."""
    import redis as redis_py
    try:
        client.ping()
    except redis_py.RedisError as exc:
        raise failed_contact(where, exc, redis(exc)) from None


def failed_contact(where: str, exc: BaseException, reason: str | None) -> BrokerError:
    """The one line for a first contact that failed: `reason` (a refusal), else unreachable."""
    if reason:
        return Refused(f"{where} {reason}")
    return BrokerConnectionError(f"{where} is unreachable ({one_line(exc)}): check that it is "
                                 "running, and the host and port in the URL")
