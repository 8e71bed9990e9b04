"""Which control channel a broker's workers listen on (see channel.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from conveyor.control import servers
from conveyor.control.channel import Channel, Poll
from conveyor.locations import REDIS, scheme

if TYPE_CHECKING:
    from conveyor.limits import Limiter


def for_broker(broker_url: str, open_records: Callable[[], Limiter]) -> Channel:
    """The control channel for workers of `broker_url` (see the module docstring): named
    after the broker's prefix or schema, so that brokers sharing a server do not hear each
    other's cancels."""
    kind = scheme(broker_url)
    if kind in REDIS:
        from conveyor.broker.redis import parse_url
        url, prefix, _ = parse_url(broker_url)
        return servers.RedisChannel(url, f"{prefix}:control")
    if kind in ("postgresql", "postgres"):
        from conveyor.broker.pgurl import parse_url as parse_postgres
        settings = parse_postgres(broker_url)
        return servers.PostgresChannel(settings.params, f"conveyor_control_{settings.schema}")
    if kind in ("amqp", "amqps"):
        from conveyor.broker.rabbitmq.settings import parse_url as parse_amqp
        # pika tries a list of parameters in turn: every node of a multi-host URL
        return servers.AmqpChannel(list(parse_amqp(broker_url).hosts), "conveyor.control")
    if kind.startswith("kombu+"):
        return _kombu(broker_url, open_records)
    return Poll(open_records)


def _kombu(broker_url: str, open_records: Callable[[], Limiter]) -> Channel:
    """kombu over Redis or RabbitMQ: the same server's channel, named after the prefix."""
    from conveyor.broker.kombu.settings import REDIS, parse_url
    settings = parse_url(broker_url)
    prefix = settings.transport_options.get("global_keyprefix", "") or settings.prefix
    if settings.transport in REDIS:
        return servers.RedisChannel(settings.url, f"{prefix}conveyor:control")
    if settings.transport in ("amqp", "amqps"):
        import pika
        return servers.AmqpChannel([pika.URLParameters(url.replace("pyamqp://", "amqp://", 1))
                                    for url in settings.hosts], f"{prefix}conveyor.control")
    return Poll(open_records)
