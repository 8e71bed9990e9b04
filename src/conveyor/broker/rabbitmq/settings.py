"""The `amqp://` URL: pika's connection parameters plus Conveyor's own query options.

pika rejects query options it does not know, so Conveyor's (`management`, `delivery_limit`,
`consumer_timeout`, `pinned_queue_expires`, `retry_seconds`) are split off before pika
parses the rest.

**A cluster.** The URL may name several nodes of one cluster, comma-separated:
`amqp://u:p@h1:5672,h2:5673,h3/vhost` (a host without a port gets the scheme's default). They
share the credentials, vhost and query; each becomes one pika `URLParameters` in `hosts`, in
the URL's order (the connection tries them in turn: see `connection`). `?management=` may
name one management API per node the same way (`http://h1:15672,http://h2:15672`); without
it each AMQP host's own port 15672 (15671 for amqps) is assumed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika

from conveyor.broker import positive_option
from conveyor.broker.reconnect import DEPRECATED_RETRY_OPTION, RETRY_OPTION, retry_seconds
from conveyor.errors import ConfigError
from conveyor.locations import redact

DEFAULT_DELIVERY_LIMIT = 25
DEFAULT_CONSUMER_TIMEOUT = 3600.0
#: Seconds a per-version queue (`<queue>@<version>`) lives without a consumer: longer than a
#: DAG task's default queued_timeout (600 s), so a version's workers restarting keep theirs.
DEFAULT_PINNED_QUEUE_EXPIRES = 3600.0


@dataclass(frozen=True)
class RabbitMQSettings:
    """A parsed `amqp://` URL: pika's parameters plus Conveyor's own query options."""

    params: pika.URLParameters  # the first host's; every host shares its vhost and login
    where: str
    management: tuple[str, ...]  # one base URL per node, tried in turn (management.py)
    management_user: str
    management_password: str
    delivery_limit: int
    consumer_timeout: float
    retry_seconds: float
    #: seconds a `<queue>@<version>` queue (and its bands, dead letters, delay levels) lives
    #: unused before RabbitMQ deletes it (`x-expires`; ladder.expiry)
    pinned_queue_expires: float = DEFAULT_PINNED_QUEUE_EXPIRES
    #: every node the URL names, in its order (one for a single host)
    hosts: tuple[pika.URLParameters, ...] = ()
    #: each host as `host:port`, for logs and errors
    host_names: tuple[str, ...] = ()


OPTIONS = ("management", "delivery_limit", "consumer_timeout", "pinned_queue_expires",
           RETRY_OPTION,
           DEPRECATED_RETRY_OPTION)


def parse_url(url: str) -> RabbitMQSettings:
    """Split Conveyor's options off the URL (pika rejects unknown ones) and parse the rest,
    once per host of a multi-host URL, or per URL of a list of whole URLs (see `whole_urls`).
    """
    urls = whole_urls(url)
    ours: dict[str, str] = {}
    hosts: tuple[pika.URLParameters, ...] = ()
    for one in urls:
        options, params = parse_one(one)
        ours = {**options, **ours}  # the first URL that gives an option gives it
        hosts += params
    parts = urlsplit(urls[0])
    params = hosts[0]
    creds = params.credentials
    user = getattr(creds, "username", "guest")
    password = getattr(creds, "password", "guest")
    management, m_user, m_password = management_urls(ours.get("management"), parts.scheme,
                                                     [h.host for h in hosts], user, password)
    return RabbitMQSettings(
        params=params, where=",".join(redact(u.split("?", 1)[0]) for u in urls),
        management=management,
        management_user=m_user, management_password=m_password,
        delivery_limit=int(positive_option(ours, "delivery_limit", DEFAULT_DELIVERY_LIMIT,
                                           url)),
        consumer_timeout=positive_option(ours, "consumer_timeout", DEFAULT_CONSUMER_TIMEOUT,
                                         url),
        pinned_queue_expires=positive_option(ours, "pinned_queue_expires",
                                             DEFAULT_PINNED_QUEUE_EXPIRES, url),
        retry_seconds=retry_seconds(ours, url), hosts=hosts,
        host_names=tuple(f"{bracket(h.host)}:{h.port}" for h in hosts))


#: Where one whole amqp:// URL of a list ends: a comma (a TOML list, comma-joined) or a
#: semicolon (Celery's failover list) before the next URL's scheme.
_NEXT_URL = re.compile(r"[,;]\s*(?=amqps?://)", re.IGNORECASE)


def whole_urls(url: str) -> list[str]:
    """A list of whole URLs (`amqp://u:p@h1/v;amqp://u:p@h2/v`, or a TOML list
    `broker_url = ["amqp://…", "amqp://…"]`, which reaches us comma-joined) split apart;
    each may have its own login and host list, and all share one vhost's queues."""
    return [u.strip() for u in _NEXT_URL.split(url) if u.strip()]


def parse_one(url: str) -> tuple[dict[str, str], tuple[pika.URLParameters, ...]]:
    """Conveyor's options and pika's parameters (one per host) of one whole URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in OPTIONS}
    rest = urlencode([(k, v) for k, v in query if k not in OPTIONS])
    login, at, hostlist = parts.netloc.rpartition("@")
    names = [h.strip() for h in hostlist.split(",")]
    if len(names) > 1 and not all(names):
        raise ConfigError(f"RabbitMQ URL {redact(url)!r} names an empty host: separate hosts "
                          "with single commas, e.g. amqp://u:p@h1:5672,h2:5672/vhost")
    try:
        return ours, tuple(pika.URLParameters(urlunsplit(parts._replace(
            netloc=f"{login}{at}{name}", query=rest))) for name in names)
    except ValueError as exc:
        raise ConfigError(f"RabbitMQ URL {redact(url)!r} is not valid: {exc}") from exc


def bracket(host: str) -> str:
    """An IPv6 literal in brackets, as a URL's netloc wants it."""
    return f"[{host}]" if ":" in host else host


def management_urls(given: str | None, scheme: str, hosts: list[str], user: str,
                    password: str) -> tuple[tuple[str, ...], str, str]:
    """(base URLs without credentials, user, password) of the management HTTP API: the
    `?management=` list (comma-separated), or each AMQP host's default management port.
    The first URL that carries a login gives it to all."""
    if not given:
        return tuple(management_url(None, scheme, host, user, password)[0]
                     for host in hosts), user, password
    bases = [management_url(one.strip(), scheme, hosts[0], user, password)
             for one in given.split(",") if one.strip()]
    if not bases:
        raise ConfigError("RabbitMQ URL option ?management= is empty: give the management "
                          "API as http://host:15672 (several nodes: comma-separated)")
    login = next(((u, p) for _, u, p in bases if (u, p) != (user, password)), (user, password))
    return tuple(base for base, _, _ in bases), *login


def management_url(given: str | None, scheme: str, host: str, user: str,
                   password: str) -> tuple[str, str, str]:
    """(base URL without credentials, user, password) of the management HTTP API."""
    if not given:
        secure = scheme.lower() == "amqps"
        host = bracket(host)
        return f"{'https' if secure else 'http'}://{host}:{15671 if secure else 15672}", \
            user, password
    parts = urlsplit(given)
    netloc = parts.hostname or "localhost"
    netloc = bracket(netloc)
    if parts.port:
        netloc += f":{parts.port}"
    base = urlunsplit((parts.scheme or "http", netloc, parts.path.rstrip("/"), "", ""))
    return base, parts.username or user, parts.password or password
