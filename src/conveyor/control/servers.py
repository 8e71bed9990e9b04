"""The control channel's push implementations: Redis pub/sub, Postgres LISTEN/NOTIFY, and a
RabbitMQ fanout exchange (see channel.py for which broker gets which). Each subscriber holds
a connection of its own; a lost connection raises from `next`, and the watch subscribes
again and reads the records (nothing announced meanwhile is lost)."""

from __future__ import annotations

from typing import Any

from conveyor.control.channel import Channel, Subscription

#: Seconds a RabbitMQ subscription waits for an id before `next` returns empty-handed.
AMQP_WAIT = 1.0


# -- Redis ---------------------------------------------------------------------------------

class RedisChannel(Channel):
    """PUBLISH / SUBSCRIBE on `name`."""

    def __init__(self, url: str, name: str) -> None:
        self._url, self.name = url, name
        self._pub: Any = None

    def _client(self) -> Any:
        import redis

        from conveyor import redis_clients
        # no retries inside redis-py: a reconnect it made by itself would resubscribe
        # without the watch reading the records it may have missed
        return redis_clients.connect(self._url, socket_connect_timeout=10,
                                      retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))

    def announce(self, message_id: str) -> None:
        if self._pub is None:
            self._pub = self._client()
        self._pub.publish(self.name, message_id)

    def subscribe(self) -> Subscription:
        client = self._client()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.name)
        return _RedisSubscription(client, pubsub)

    def close(self) -> None:
        if self._pub is not None:
            self._pub.close()


class _RedisSubscription(Subscription):
    def __init__(self, client: Any, pubsub: Any) -> None:
        self._client, self._pubsub = client, pubsub

    def next(self, timeout: float) -> list[str]:
        heard, wait = [], timeout
        while (found := self._pubsub.get_message(timeout=wait)) is not None:
            if found.get("type") == "message":
                heard.append(bytes(found["data"]).decode())
            wait = 0.0
        return heard

    def close(self) -> None:
        self._pubsub.close()
        self._client.close()


# -- Postgres --------------------------------------------------------------------------------

class PostgresChannel(Channel):
    """NOTIFY / LISTEN on `name` (one per schema), in the broker's database."""

    def __init__(self, params: dict[str, Any], name: str) -> None:
        self._params, self.name = params, name
        self._pub: Any = None

    def _connect(self) -> Any:
        import psycopg
        return psycopg.connect(**self._params, autocommit=True)

    def announce(self, message_id: str) -> None:
        if self._pub is None:
            self._pub = self._connect()
        self._pub.execute("SELECT pg_notify(%s, %s)", (self.name, message_id))

    def subscribe(self) -> Subscription:
        from psycopg import sql
        conn = self._connect()
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.name)))
        return _PostgresSubscription(conn)

    def close(self) -> None:
        if self._pub is not None:
            self._pub.close()


class _PostgresSubscription(Subscription):
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def next(self, timeout: float) -> list[str]:
        return [n.payload for n in self._conn.notifies(timeout=timeout, stop_after=1)]

    def close(self) -> None:
        self._conn.close()


# -- RabbitMQ --------------------------------------------------------------------------------

class AmqpChannel(Channel):
    """A fanout exchange `name`; each subscriber binds an exclusive queue of its own, which
    RabbitMQ deletes when the subscriber's connection ends."""

    def __init__(self, params: Any, name: str) -> None:
        self._params, self.name = params, name
        self._pub: Any = None

    def _open(self) -> tuple[Any, Any]:
        import pika
        conn = pika.BlockingConnection(self._params)
        channel = conn.channel()
        channel.exchange_declare(self.name, exchange_type="fanout")
        return conn, channel

    def announce(self, message_id: str) -> None:
        import pika.exceptions
        for attempt in (1, 2):  # a publisher idle past its heartbeat was dropped: reopen once
            if self._pub is None:
                self._pub = self._open()
            try:
                self._pub[1].basic_publish(self.name, "", message_id.encode())
                return
            except pika.exceptions.AMQPError:
                self.close()
                if attempt == 2:
                    raise

    def subscribe(self) -> Subscription:
        conn, channel = self._open()
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        channel.queue_bind(queue, self.name)
        return _AmqpSubscription(conn, channel.consume(queue, auto_ack=True,
                                                       inactivity_timeout=AMQP_WAIT))

    def close(self) -> None:
        if self._pub is not None:
            conn, self._pub = self._pub[0], None
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing what already broke
                return


class _AmqpSubscription(Subscription):
    def __init__(self, conn: Any, deliveries: Any) -> None:
        self._conn, self._deliveries = conn, deliveries

    def next(self, timeout: float) -> list[str]:
        """One id, or none after AMQP_WAIT (pika's inactivity timeout, fixed per consumer)."""
        method, _, body = next(self._deliveries)
        return [] if method is None else [bytes(body).decode()]

    def close(self) -> None:
        if self._conn.is_open:
            self._conn.close()
