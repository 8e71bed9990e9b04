"""Publishing work: the producer side of the broker seam, with encoding and signing."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conveyor import tracing
from conveyor.config import Settings
from conveyor.message import Codec, Message
from conveyor.results.base import RESULT_HEADER
from conveyor.results.handle import ResultHandle

if TYPE_CHECKING:
    from conveyor.broker import Broker, Publication
    from conveyor.results.base import ResultStore


class Client:
    """Encodes, signs and publishes messages on one broker; opens the result store (from
    `settings`, else the CONVEYOR_* environment) the first time a result is asked for."""

    def __init__(self, broker: Broker, codec: Codec | None = None, *,
                 settings: Settings | None = None, results: ResultStore | None = None) -> None:
        self.broker = broker
        self.codec = codec or Codec()
        self.settings = settings
        self._results = results
        if settings is not None:
            tracing.configure(settings.tracing, "conveyor-client")

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client on the settings' broker, signing with their key.

        The broker package is imported here, not at the top: `Client` is part of the public
        API that every worker process imports, and a runner never opens a broker.
        """
        from conveyor import broker as brokers
        return cls(brokers.from_url(settings.broker_url), settings.codec(), settings=settings)

    def enqueue(self, message: Message, delay: float = 0.0, *,
                keep_result: bool = False) -> ResultHandle:
        """Publish `message`, deliverable after `delay` seconds; returns a handle on what was
        sent (`handle.message`). With `keep_result` the worker stores the outcome for
        `handle.result()`; a message that does not ask costs the worker nothing."""
        if delay > 0:
            message = replace(message, not_before=time.time() + delay)
        if keep_result and RESULT_HEADER not in message.headers:
            message = replace(message, headers={**message.headers, RESULT_HEADER: "keep"})
        tracer = tracing.current()
        if tracer is None:
            self._publish(message, delay)
        else:
            with tracer.producing(message) as message:
                self._publish(message, delay)
        return ResultHandle(message, self.results)

    def _publish(self, message: Message, delay: float) -> None:
        self.broker.publish(message.queue, self.codec.encode(message),
                            priority=message.priority, delay=delay)

    def publication(self, message: Message, delay: float = 0.0) -> Publication:
        """`message` encoded (and signed) for `Broker.publish_many`, as `enqueue` sends it."""
        from conveyor.broker import Publication  # `import conveyor` stays light
        if delay > 0:
            message = replace(message, not_before=time.time() + delay)
        tracer = tracing.current()
        if tracer is not None:
            message = tracer.produced(message)
        return Publication(message.queue, self.codec.encode(message), message.priority, delay)

    def enqueue_command(self, command: Sequence[str], queue: str = "default",
                        delay: float = 0.0, *, keep_result: bool = False,
                        **fields: Any) -> ResultHandle:
        """Publish a shell-command workload (exec'd by the runner, like an Airflow task)."""
        return self.enqueue(Message(queue=queue, command=tuple(command), **fields), delay,
                            keep_result=keep_result)

    def results(self) -> ResultStore:
        """The result store (`CONVEYOR_RESULT_URL`, else the default for the broker)."""
        if self._results is None:
            from conveyor import results
            settings = self.settings or Settings.from_env()
            self._results = results.from_url(results.url_for(settings))
        return self._results

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
        self.broker.close()


_default: Client | None = None


def default_client() -> Client:
    """A client built from the CONVEYOR_* environment on first use."""
    global _default
    if _default is None:
        _default = Client.from_settings(Settings.from_env())
    return _default
