"""Publishing work: the producer side of the broker seam, with encoding and signing."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conveyor import tracing
from conveyor.config import Settings, read
from conveyor.control import CANCEL_TTL, CancelResult
from conveyor.errors import ConfigError
from conveyor.flow import UNIQUE_HEADER, UNIQUE_HOLD
from conveyor.message import Codec, Message
from conveyor.results.base import RESULT_HEADER
from conveyor.results.handle import ResultHandle
from conveyor.settings_table import ROWS

#: The schedulers' control queue (CONVEYOR_SCHEDULER_CONTROL_QUEUE's default): a message
#: there makes one tick now, as `conveyor dags trigger` does after creating a run.
CONTROL_QUEUE = ROWS["CONVEYOR_SCHEDULER_CONTROL_QUEUE"].default

if TYPE_CHECKING:
    from conveyor.broker import Producer, Publication
    from conveyor.control.channel import Channel
    from conveyor.limits import Limiter
    from conveyor.results.base import ResultStore


class Client:
    """Encodes, signs and publishes messages on one broker; opens the result store (from
    `settings`, else the CONVEYOR_* environment) the first time a result is asked for, and
    flow control's store the first time a unique key is."""

    def __init__(self, broker: Producer, codec: Codec | None = None, *,
                 settings: Settings | None = None, results: ResultStore | None = None,
                 limiter: Limiter | None = None,
                 open_limiter: Callable[[], Limiter] | None = None) -> None:
        """`limiter` (or `open_limiter`, called on the first unique key) holds unique keys;
        without either, the store `settings` name (see `limiter`)."""
        self.broker = broker
        self.codec = codec or Codec()
        self.settings = settings
        self._results = results
        self._limiter = limiter
        self._open_limiter = open_limiter
        self._channel: Channel | None = None
        if settings is not None:
            tracing.configure(settings.tracing, "conveyor-client")

    @classmethod
    def from_settings(cls, settings: Settings) -> Client:
        """A client on the settings' broker, signing with their key.

        The broker package is imported here, not at the top: `Client` is part of the public
        API that every worker process imports, and a runner never opens a broker. Inside a
        task, settings without a broker URL (a task's environment never has the worker's)
        give the task's client, which publishes through the worker (worker/followups.py).
        """
        if not settings.broker_url and _inside_task is not None:
            return _inside_task
        from conveyor import broker as brokers
        return cls(brokers.from_url(settings.broker_url), settings.codec(), settings=settings)

    def enqueue(self, message: Message, delay: float = 0.0, *, keep_result: bool = False,
                unique_key: str = "", unique_for: float = 0.0) -> ResultHandle:
        """Publish `message`, deliverable after `delay` seconds; returns a handle on what was
        sent (`handle.message`). With `keep_result` the worker stores the outcome for
        `handle.result()`; a message that does not ask costs the worker nothing.

        `unique_key`: publish only if no other message holds that key, else publish nothing
        and return the holder's handle (`handle.duplicate`, `handle.id` the holder's id). The
        key is held until the message's terminal outcome, or with `unique_for` for that many
        seconds from now whatever happens (README "Once per key")."""
        if keep_result and RESULT_HEADER not in message.headers:
            message = replace(message, headers={**message.headers, RESULT_HEADER: "keep"})
        if unique_key:
            first = self._hold(message, unique_key, delay, unique_for)
            if first != message.id:
                return ResultHandle(replace(message, id=first), self.results, self.cancel,
                                    duplicate=True)
            if not unique_for:
                message = replace(message, headers={**message.headers, UNIQUE_HEADER: unique_key})
        try:
            return self._send(message, delay)
        except BaseException:
            if unique_key:
                self.limiter().unhold(unique_key, message.id)  # nothing holds it: give it back
            raise

    def _send(self, message: Message, delay: float) -> ResultHandle:
        if delay > 0:
            message = replace(message, not_before=time.time() + delay)
        tracer = tracing.current()
        if tracer is None:
            self._publish(message, delay)
        else:
            with tracer.producing(message) as message:
                self._publish(message, delay)
        return ResultHandle(message, self.results, self.cancel)

    def cancel(self, message_id: str, *, ttl: float = CANCEL_TTL) -> CancelResult:
        """Cancel the message `message_id`: queued, delayed or parked behind a limit, it
        never starts; running, its worker stops it (`Cancelled` is raised in the task, which
        is killed `--cancel-grace` seconds later). Its outcome is `cancelled`: not retried,
        not dead-lettered; a kept result raises `Cancelled`.

        Durable and idempotent: the record (kept `ttl` seconds) is honoured by whichever
        worker is given the message, now or after a restart; cancelling again changes
        nothing (ALREADY_CANCELLED), nor does cancelling a message whose result is stored
        (FINISHED; a message that kept no result cannot be told from a queued one, and is
        recorded). README "Cancel"."""
        if self._finished(message_id):
            return CancelResult.FINISHED
        recorded = self.limiter().cancel(message_id, time.time(), ttl)
        # announced again when it was recorded already: a cancel whose announcement failed
        # (the server unreachable: it raised) reaches its running worker when retried
        self.control().announce(message_id)
        return CancelResult.CANCELLED if recorded else CancelResult.ALREADY_CANCELLED

    def _finished(self, message_id: str) -> bool:
        """Whether the message's outcome is in the result store (and not a cancel)."""
        record = self.results().get(message_id)
        return record is not None and record.status != "cancelled"

    def control(self) -> Channel:
        """The control channel to this client's workers (conveyor/control/channel.py)."""
        if self._channel is None:
            from conveyor.control.for_broker import for_broker
            url = self.settings.broker_url if self.settings is not None else \
                Settings.from_env().broker_url
            self._channel = for_broker(url, self.limiter)
        return self._channel

    def _hold(self, message: Message, key: str, delay: float, window: float) -> str:
        """The id of the message holding `key` once this one tried to take it."""
        if window < 0:
            raise ConfigError(f"unique_for={window:g} for key {key!r}: give a number of "
                              "seconds above 0, or 0 to hold the key until the outcome")
        ttl = window if window > 0 else max(delay, 0.0) + UNIQUE_HOLD
        return self.limiter().hold(key, message.id, time.time(), ttl)

    def limiter(self) -> Limiter:
        """Flow control's store, where unique keys are held: the broker's own when it is
        Redis, Postgres or SQLite, else the state store (or CONVEYOR_LIMITS_URL), as the
        workers' limiter (`Settings.stores`), from `settings` or the CONVEYOR_* environment."""
        if self._limiter is None and self._open_limiter is not None:
            self._limiter = self._open_limiter()
        if self._limiter is None:
            from conveyor import limits
            s = self.settings or Settings.from_env()
            self._limiter = limits.from_url(s.stores().limits)
        return self._limiter

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

    def touch_asset(self, uri: str, extra: Mapping[str, Any] | None = None) -> int:
        """Record an event of asset `uri` from outside a DAG (`conveyor assets touch`): the
        DAGs scheduled on it count it as a producing task's; the event's id."""
        from conveyor.state.assets import asset_uri
        return self._record_event(asset_uri(uri), extra, None)[0]

    def send_event(self, name: str, payload: Mapping[str, Any] | None = None, *,
                   dedupe_key: str | None = None) -> tuple[int, bool]:
        """Send named event `name` (`conveyor events send`): each DAG scheduled on
        `Event(name)` gets a run with `payload` as its conf. (event id, whether it is new):
        a `dedupe_key` sent before for this name is a no-op."""
        from conveyor.state.assets import event_key
        return self._record_event(event_key(name), payload, dedupe_key)

    def _record_event(self, uri: str, extra: Mapping[str, Any] | None,
                      dedupe_key: str | None) -> tuple[int, bool]:
        """Record it in the state store, then wake a scheduler (its control queue)."""
        from conveyor.state import store as stores
        from conveyor.state.assets import record_event
        settings = self.settings or Settings.from_env()
        store = stores.from_url(settings.stores().state)
        try:
            found = record_event(store, uri, extra or {}, time.time(), source="client",
                                 dedupe_key=dedupe_key)
        finally:
            store.close()
        if found[1]:
            queue = read("CONVEYOR_SCHEDULER_CONTROL_QUEUE") or CONTROL_QUEUE
            self.broker.publish(queue, b'{"run_id": ""}')
        return found

    def results(self) -> ResultStore:
        """The result store (`CONVEYOR_RESULT_URL`, else the default for the broker)."""
        if self._results is None:
            from conveyor import results
            settings = self.settings or Settings.from_env()
            self._results = results.from_url(settings.stores().results)
        return self._results

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
        if self._limiter is not None:
            self._limiter.close()
        if self._channel is not None:
            self._channel.close()
        self.broker.close()


_default: Client | None = None
#: Inside a worker's runner: the client that publishes through the worker (set by the runner
#: before any task code runs, see `conveyor.worker.followups`); None everywhere else.
_inside_task: Client | None = None


def default_client() -> Client:
    """A client built from the CONVEYOR_* environment on first use; inside a task, the one
    that publishes through the worker running it."""
    global _default
    if _inside_task is not None:
        return _inside_task
    if _default is None:
        _default = Client.from_settings(Settings.from_env())
    return _default


def use_inside_task(client: Client) -> None:
    """Make `client` this process's default client, also for `Client.from_settings` without
    a broker URL: a runner's, whatever a module imported before the fork built."""
    global _inside_task
    _inside_task = client
