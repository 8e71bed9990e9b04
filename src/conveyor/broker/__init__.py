"""Brokers: one seam (`Broker`), one module per transport, chosen by URL.

`from_url("sqlite:///path")`, `"redis://…"`, `"amqp://…"`, `"postgresql://…"`, and
`"kombu+<transport>://…"` for any broker kombu reaches (weaker guarantees). With no URL
configured the broker is SQLite in a per-user data file (`locations.embedded_broker_url`).
Transports are imported lazily so a worker on Redis never loads pika or psycopg.
"""

from __future__ import annotations

import importlib
from typing import Any

from conveyor.broker.base import (
    DEFAULT_LEASE_SECONDS,
    Broker,
    DeadLetter,
    Delivery,
    Depth,
    Publication,
)
from conveyor.broker.roles import Administrator, Consumer, Inspector, Producer
from conveyor.context import inside_task
from conveyor.errors import ConfigError
from conveyor.locations import embedded_broker_url, redact, scheme

# URL scheme -> "module:Class"
TRANSPORTS = {
    "sqlite": "conveyor.broker.sqlite:SQLiteBroker",
    "redis": "conveyor.broker.redis:RedisBroker",
    "rediss": "conveyor.broker.redis:RedisBroker",
    "redis+sentinel": "conveyor.broker.redis:RedisBroker",
    "amqp": "conveyor.broker.rabbitmq:RabbitMQBroker",
    "amqps": "conveyor.broker.rabbitmq:RabbitMQBroker",
    "postgresql": "conveyor.broker.postgres:PostgresBroker",
    "postgres": "conveyor.broker.postgres:PostgresBroker",
}
#: Every `kombu+<transport>` scheme (kombu+redis, kombu+amqp, kombu+sqs, ...).
KOMBU = "conveyor.broker.kombu:KombuBroker"


def from_url(url: str | None = None, **options: Any) -> Broker:
    """The broker for `url` (the embedded default when empty, except inside a task)."""
    if not url and inside_task():
        raise ConfigError(
            "no broker URL inside a task: a task's environment never holds its worker's, "
            "and the embedded default here is not the worker's broker. In a Python task, "
            "task.enqueue and default_client() publish through the worker; a command task, "
            "or a client of your own, needs a broker URL given explicitly")
    url = url or embedded_broker_url()
    kind = scheme(url)
    target = TRANSPORTS.get(kind) or (KOMBU if kind.startswith("kombu+") else None)
    if target is None:
        raise ConfigError(
            f"broker URL {redact(url)!r} has an unknown scheme {kind!r}: use one of "
            + ", ".join(f"{s}://" for s in sorted(TRANSPORTS)) + ", kombu+<transport>://"
        )
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    broker: Broker = cls(url, **options)
    return broker


def positive_option(options: dict[str, str], key: str, default: float, url: str) -> float:
    """A positive number from a broker URL's query, or a ConfigError naming URL and key."""
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"broker URL {redact(url)!r}: {key}={raw!r} must be a positive "
                          "number")
    return value


__all__ = ["DEFAULT_LEASE_SECONDS", "Administrator", "Broker", "Consumer", "DeadLetter",
           "Delivery", "Depth", "Inspector", "Producer", "Publication", "from_url",
           "positive_option"]
