"""The one place a Redis URL becomes a redis-py client, for every part that keeps something in
Redis (the broker, results, the limiter, the control channel, Celery's result backend).

Two kinds of address:

* ``redis://[[user]:password@]host:port/db`` (``rediss://`` for TLS): one server;
* ``redis+sentinel://[[user]:password@]s1:26379,s2:26380,s3:26381/mymaster/0``: the master
  that Redis Sentinel names ``mymaster``, found by asking the Sentinels listed (redis-py's
  `Sentinel`; a port left out is 26379). Every (re)connect asks them again, so a client whose
  connection died with a failed primary reconnects to the replica the Sentinels promoted,
  and a connection still open to a demoted primary is dropped at its first refused write.
  The password in the URL (or ``?password=``) is the master's; ``?sentinel_password=`` (and
  ``?sentinel_username=``) are the Sentinels' own, when they require one.

Conveyor's own query options (`OURS`) are read by the part they concern and never passed to
redis-py; any other option is redis-py's own (``socket_timeout``, ``ssl`` ...).

Why one place: each part used to call ``redis.Redis.from_url`` with its own URL handling, so
a new kind of address (Sentinel) would have been taught to each of them, or missed by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import SSLConnection
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)

from conveyor.errors import ConfigError
from conveyor.locations import redact

SENTINEL = "redis+sentinel"
SCHEMES = ("redis", "rediss", SENTINEL)
SENTINEL_PORT = 26379
#: Query options that are Conveyor's, read by the part they concern (the broker's key prefix
#: and retry budget, the durable mode's WAIT), never handed to redis-py.
OURS = frozenset({"prefix", "retry_seconds", "reconnect_timeout", "wait_replicas",
                  "wait_timeout_ms"})
#: Options of a Sentinel URL that are about the Sentinels themselves, not the master.
SENTINEL_OPTIONS = {"sentinel_password": "password", "sentinel_username": "username"}
#: How long one Sentinel may take to answer "where is the master" before the next is asked:
#: a Sentinel that is down or cut off must not hold up a reconnect for long (nor is it asked
#: twice: the next one is, and the caller's own retries ask them all again).
SENTINEL_TIMEOUT = 2.0


#: The durable mode's default wait for the replicas, and the most a URL may ask: a WAIT
#: longer than the clients' socket timeouts would be cut by the client itself.
WAIT_TIMEOUT_MS = 1000
WAIT_TIMEOUT_MAX_MS = 10_000


@dataclass(frozen=True)
class Durable:
    """The durable mode (``?wait_replicas=N&wait_timeout_ms=T``): after each write that
    must survive a failover (a publish, an ack, a result), ``WAIT N T`` on the same
    connection, which returns once N replicas have every write of that connection so far,
    or after T ms with how many have. Redis replicates asynchronously: without this, a write
    the primary acknowledged is lost if the primary dies before a replica has it."""

    replicas: int
    timeout_ms: int = WAIT_TIMEOUT_MS

    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)

    def shortfall(self, acked: Any, what: str, where: str) -> str | None:
        """None if `acked` (WAIT's answer) is enough, else the sentence saying it is not."""
        if int(acked) >= self.replicas:
            return None
        return (f"{what}: Redis at {where} has it, but only {int(acked)} of the "
                f"{self.replicas} replica(s) asked for (?wait_replicas=) acknowledged it "
                f"within {self.timeout_ms} ms; should the primary fail now, it may be lost")


def durable(url: str) -> Durable | None:
    """The durable mode a Redis URL asks for, or None (the default: asynchronous)."""
    query = dict(parse_qsl(urlsplit(url).query))
    replicas, timeout = query.get("wait_replicas"), query.get("wait_timeout_ms")
    if replicas is None:
        if timeout is not None:
            raise ConfigError(f"Redis URL {redact(url)!r}: wait_timeout_ms= needs "
                              "wait_replicas= (how many replicas must have each write)")
        return None
    if not replicas.isdigit() or not 1 <= int(replicas) <= 100:
        raise ConfigError(f"Redis URL {redact(url)!r}: wait_replicas={replicas!r} must be a "
                          "whole number of replicas, 1 or more (leave it out for the "
                          "asynchronous default)")
    if timeout is not None and (not timeout.isdigit()
                                or not 1 <= int(timeout) <= WAIT_TIMEOUT_MAX_MS):
        raise ConfigError(f"Redis URL {redact(url)!r}: wait_timeout_ms={timeout!r} must be "
                          f"a whole number of milliseconds from 1 to {WAIT_TIMEOUT_MAX_MS}")
    return Durable(int(replicas), int(timeout) if timeout else WAIT_TIMEOUT_MS)


class _MasterConnection(SentinelManagedConnection):
    """A connection to the master the Sentinels name, asked again at every (re)connect.

    redis-py's `SentinelManagedConnection` asks them in `connect()`, but a command sent on a
    disconnected connection reconnects through `connect_check_health()` (redis-py 8's
    `send_packed_command`), which it does not override: a single-connection client (the
    broker's) then reconnected to the dead primary's address forever after a failover."""

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health,
                                     retry_socket_connect=retry_socket_connect)


class _MasterSSLConnection(_MasterConnection, SSLConnection):
    """The same over TLS."""


class UnknownMaster(MasterNotFoundError):
    """Sentinels answered, and none of them monitors a master of that name: a wrong URL,
    which retrying does not fix (`refusals.redis` says so at the first contact)."""


@dataclass(frozen=True)
class SentinelAddress:
    """A ``redis+sentinel://`` URL taken apart."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int
    #: redis-py connection options for the master (password, username, socket_timeout ...)
    options: dict[str, Any] = field(default_factory=dict)
    #: the Sentinels' own login, if they require one
    sentinel_options: dict[str, Any] = field(default_factory=dict)


def is_redis(url: str) -> bool:
    """Whether `url` names a Redis server or a Sentinel-managed master."""
    return url.split("://", 1)[0].lower() in SCHEMES if "://" in url else False


def without_ours(url: str) -> str:
    """`url` without Conveyor's own query options (`OURS`): what redis-py may read."""
    parts = urlsplit(url)
    rest = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in OURS]
    return urlunsplit(parts._replace(query=urlencode(rest)))


def parse_sentinel(url: str) -> SentinelAddress:
    """The Sentinels, master name, database and options of a ``redis+sentinel://`` URL, or a
    ConfigError saying what is wrong and what the URL should look like."""
    example = "e.g. redis+sentinel://s1:26379,s2:26380,s3:26381/mymaster/0"
    parts = urlsplit(without_ours(url))
    creds, _, hosts = parts.netloc.rpartition("@")
    sentinels = tuple(_host_port(h, url, example) for h in hosts.split(",") if h.strip())
    if not sentinels:
        raise ConfigError(f"Redis URL {redact(url)!r} names no Sentinel: list them as "
                          f"host:port before the master name, {example}")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ConfigError(f"Redis URL {redact(url)!r} must name the master the Sentinels "
                          f"monitor, and may add a database number: /<master>[/<db>], "
                          f"{example}")
    if len(path) == 2 and not path[1].isdigit():
        raise ConfigError(f"Redis URL {redact(url)!r}: its database {path[1]!r} is not a "
                          f"number, {example}")
    # redis-py's own parsing of the other options (types, ssl), on a one-server URL
    plain = urlunsplit(("rediss" if _truthy(parts.query, "ssl") else "redis",
                        (creds + "@" if creds else "") + "localhost", "",
                        urlencode([(k, v) for k, v in parse_qsl(parts.query)
                                   if k not in SENTINEL_OPTIONS and k != "ssl"]), ""))
    try:
        options = redis.connection.parse_url(plain)
    except ValueError as exc:
        raise ConfigError(f"Redis URL {redact(url)!r}: {exc}") from None
    for key in ("host", "port"):
        options.pop(key, None)
    options.pop("db", None)
    ssl = options.pop("connection_class", None) is SSLConnection
    options["connection_class"] = _MasterSSLConnection if ssl else _MasterConnection
    theirs = {SENTINEL_OPTIONS[k]: v for k, v in parse_qsl(parts.query)
              if k in SENTINEL_OPTIONS}
    return SentinelAddress(sentinels, path[0], int(path[1]) if len(path) == 2 else 0,
                           options, theirs)


def _truthy(query: str, key: str) -> bool:
    return dict(parse_qsl(query)).get(key, "").lower() in ("1", "true", "yes", "on")


def _host_port(text: str, url: str, example: str) -> tuple[str, int]:
    """'host:port', '[::1]:port' or 'host' (port 26379)."""
    text = text.strip()
    host, port = text, str(SENTINEL_PORT)
    if text.startswith("["):
        host, _, tail = text[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else port
    elif ":" in text:
        host, port = text.rsplit(":", 1)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"Redis URL {redact(url)!r}: Sentinel {text!r} is not host:port "
                          f"with a port from 1 to 65535, {example}")
    return host, int(port)


class _Sentinels(Sentinel):
    """redis-py's Sentinel client, whose "no master" error says which case it is."""

    def __init__(self, sentinels: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        super().__init__(sentinels,  # type: ignore[no-untyped-call]
                         sentinel_kwargs=sentinel_kwargs)

    def discover_master(self, service_name: str) -> tuple[str, int]:
        try:
            address: tuple[str, int] = super().discover_master(  # type: ignore[no-untyped-call]
                service_name)
            return address
        except MasterNotFoundError:
            pass
        answered: list[str] = []
        known: set[str] = set()
        down = False
        for sentinel in self.sentinels:
            where = "{host}:{port}".format_map(sentinel.connection_pool.connection_kwargs)
            try:
                masters = sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError):
                continue
            answered.append(where)
            known.update(str(name) for name in masters)
            down = down or service_name in masters
        if not answered:
            raise MasterNotFoundError(
                f"no Sentinel answered ({self._where()}) when asked for master "
                f"{service_name!r}: check that redis-sentinel runs there, and the hosts and "
                "ports in the URL")
        if not down:
            raise UnknownMaster(
                f"the Sentinels at {', '.join(answered)} monitor no master named "
                f"{service_name!r} (they monitor: {', '.join(sorted(known)) or 'none'}): fix "
                "the master name in the URL (redis+sentinel://hosts/<master>/<db>)")
        raise MasterNotFoundError(
            f"the Sentinels at {', '.join(answered)} see master {service_name!r} down and "
            "have not promoted a replica yet (a failover under way, or no replica to promote)")

    def _where(self) -> str:
        return ", ".join("{host}:{port}".format_map(s.connection_pool.connection_kwargs)
                         for s in self.sentinels)


def connect(url: str, **options: Any) -> redis.Redis:
    """A redis-py client for `url` (Conveyor's own query options ignored). `options` are
    redis-py's (socket timeouts, client_name, retry, single_connection_client ...) and go to
    the master's connections alike for both kinds of URL. Connects lazily, as redis-py does."""
    kind = url.split("://", 1)[0].lower() if "://" in url else ""
    if kind != SENTINEL:
        return redis.Redis.from_url(without_ours(url), **options)
    address = parse_sentinel(url)
    single = bool(options.pop("single_connection_client", False))
    connect_timeout = options.get("socket_connect_timeout") or SENTINEL_TIMEOUT
    sentinels = _Sentinels(
        list(address.sentinels),
        sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT, "retry": Retry(NoBackoff(), 0),
                         "socket_connect_timeout": min(connect_timeout, SENTINEL_TIMEOUT),
                         **address.sentinel_options})
    pool = SentinelConnectionPool(address.master, sentinels, db=address.db,
                                  **{**address.options, **options})
    return redis.Redis(connection_pool=pool, single_connection_client=single)

