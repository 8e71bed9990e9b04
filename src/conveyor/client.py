"""Publishing work: the producer side of the broker seam, with encoding and signing."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conveyor.config import Settings
from conveyor.message import Codec, Message

if TYPE_CHECKING:
    from conveyor.broker import Broker


class Client:
    """Encodes, signs and publishes messages on one broker."""

    def __init__(self, broker: Broker, codec: Codec | None = None) -> None:
        self.broker = broker
        self.codec = codec or Codec()

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client on the settings' broker, signing with their key.

        The broker package is imported here, not at the top: `Client` is part of the public
        API that every worker process imports, and a runner never opens a broker.
        """
        from conveyor import broker as brokers
        return cls(brokers.from_url(settings.broker_url), settings.codec())

    def enqueue(self, message: Message, delay: float = 0.0) -> Message:
        """Publish `message`, deliverable after `delay` seconds; returns what was sent."""
        if delay > 0:
            message = replace(message, not_before=time.time() + delay)
        self.broker.publish(message.queue, self.codec.encode(message),
                            priority=message.priority, delay=delay)
        return message

    def enqueue_command(self, command: Sequence[str], queue: str = "default",
                        delay: float = 0.0, **fields: Any) -> Message:
        """Publish a shell-command workload (exec'd by the runner, like an Airflow task)."""
        return self.enqueue(Message(queue=queue, command=tuple(command), **fields), delay)

    def close(self) -> None:
        self.broker.close()


_default: Client | None = None


def default_client() -> Client:
    """A client built from the CONVEYOR_* environment on first use."""
    global _default
    if _default is None:
        _default = Client.from_settings(Settings.from_env())
    return _default
