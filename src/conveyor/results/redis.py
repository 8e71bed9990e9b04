"""Results as Redis keys with a TTL, beside the broker's queues (the default on Redis).

`put` is one MULTI: `SET key record NX EX ttl` (first write wins) and a `PUBLISH` on the
key's own channel. `wait` subscribes to that channel first and reads the key second, so a
record stored between the two is never missed, then sleeps in the socket until the publish.
Keys are `<prefix>:r:<message id>`, under the broker URL's `?prefix=`.
"""

from __future__ import annotations

import math
import time

import redis
from redis.exceptions import InvalidResponse

from conveyor import redis_clients, refusals
from conveyor.broker.redis import parse_url
from conveyor.errors import BrokerError
from conveyor.locations import redact
from conveyor.results.base import ResultRecord, ResultStore

#: What a call may meet that is about the server, not the call: an outage, a login refused
#: (redis-py's AuthenticationError is a ConnectionError), another kind of server answering.
FAILED_CONTACT = (redis.ConnectionError, InvalidResponse)


class RedisResults(ResultStore):
    def __init__(self, url: str) -> None:
        address, self.prefix, _ = parse_url(url)
        self._url = url
        self._client = redis_clients.connect(address, socket_connect_timeout=10)

    def _key(self, message_id: str) -> str:
        return f"{self.prefix}:r:{message_id}"

    def put(self, message_id: str, record: ResultRecord, ttl: float) -> bool:
        key = self._key(message_id)
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.set(key, record.encode(), nx=True, px=max(1, math.ceil(ttl * 1000)))
                pipe.publish(key, b"1")
                stored, _ = pipe.execute()
        except FAILED_CONTACT as exc:
            raise self._failed(exc) from None
        return bool(stored)

    def get(self, message_id: str) -> ResultRecord | None:
        try:
            body = self._client.get(self._key(message_id))
        except FAILED_CONTACT as exc:
            raise self._failed(exc) from None
        if body is None:
            return None
        return ResultRecord.decode(body if isinstance(body, bytes) else body.encode())

    def wait(self, message_id: str, timeout: float) -> ResultRecord | None:
        deadline = time.monotonic() + timeout
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(self._key(message_id))
            found = self.get(message_id)
            while found is None and (remaining := deadline - time.monotonic()) > 0:
                if pubsub.get_message(timeout=remaining) is not None:
                    found = self.get(message_id)
            return found
        except FAILED_CONTACT as exc:
            raise self._failed(exc) from None
        finally:
            pubsub.close()

    def _failed(self, exc: Exception) -> BrokerError:
        """Unreachable, or a refusal (a login, another kind of server): one line."""
        return refusals.failed_contact(f"the result store: Redis at {redact(self._url)}", exc,
                                       refusals.redis(exc))

    def close(self) -> None:
        self._client.close()
