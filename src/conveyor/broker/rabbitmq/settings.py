"""The `amqp://` URL: pika's connection parameters plus Conveyor's own query options.

pika rejects query options it does not know, so Conveyor's (`management`, `delivery_limit`,
`consumer_timeout`, `retry_seconds`) are split off before pika parses the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika

from conveyor.broker import positive_option
from conveyor.broker.reconnect import DEPRECATED_RETRY_OPTION, RETRY_OPTION, retry_seconds
from conveyor.errors import ConfigError
from conveyor.locations import redact

DEFAULT_DELIVERY_LIMIT = 25
DEFAULT_CONSUMER_TIMEOUT = 3600.0


@dataclass(frozen=True)
class RabbitMQSettings:
    """A parsed `amqp://` URL: pika's parameters plus Conveyor's own query options."""

    params: pika.URLParameters
    where: str
    management: str
    management_user: str
    management_password: str
    delivery_limit: int
    consumer_timeout: float
    retry_seconds: float


OPTIONS = ("management", "delivery_limit", "consumer_timeout", RETRY_OPTION,
           DEPRECATED_RETRY_OPTION)


def parse_url(url: str) -> RabbitMQSettings:
    """Split Conveyor's options off the URL (pika rejects unknown ones) and parse the rest."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in OPTIONS}
    amqp_url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query
                                                          if k not in OPTIONS])))
    try:
        params = pika.URLParameters(amqp_url)
    except ValueError as exc:
        raise ConfigError(f"RabbitMQ URL {redact(url)!r} is not valid: {exc}") from exc
    creds = params.credentials
    user = getattr(creds, "username", "guest")
    password = getattr(creds, "password", "guest")
    management, m_user, m_password = management_url(ours.get("management"), parts.scheme,
                                                    params.host, user, password)
    return RabbitMQSettings(
        params=params, where=redact(url.split("?", 1)[0]), management=management,
        management_user=m_user, management_password=m_password,
        delivery_limit=int(positive_option(ours, "delivery_limit", DEFAULT_DELIVERY_LIMIT,
                                           url)),
        consumer_timeout=positive_option(ours, "consumer_timeout", DEFAULT_CONSUMER_TIMEOUT,
                                         url),
        retry_seconds=retry_seconds(ours, url))


def management_url(given: str | None, scheme: str, host: str, user: str,
                   password: str) -> tuple[str, str, str]:
    """(base URL without credentials, user, password) of the management HTTP API."""
    if not given:
        secure = scheme.lower() == "amqps"
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if secure else 'http'}://{host}:{15671 if secure else 15672}", \
            user, password
    parts = urlsplit(given)
    netloc = parts.hostname or "localhost"
    netloc = f"[{netloc}]" if ":" in netloc else netloc
    if parts.port:
        netloc += f":{parts.port}"
    base = urlunsplit((parts.scheme or "http", netloc, parts.path.rstrip("/"), "", ""))
    return base, parts.username or user, parts.password or password
