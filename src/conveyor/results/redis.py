"""Results as Redis keys with a TTL, beside the broker's queues (the default on Redis).

`put` is one MULTI: `SET key record NX EX ttl` (first write wins) and a `PUBLISH` on the
key's own channel. `wait` subscribes to that channel first and reads the key second, so a
record stored between the two is never missed, then sleeps in the socket until the publish.
Keys are `<prefix>:r:<message id>`, under the broker URL's `?prefix=`.

Durable mode (the URL's `?wait_replicas=N`, `redis_clients.Durable`): `put` is the same two
commands in one script, then `WAIT` on the same connection (a pipeline); a record the
replicas did not confirm raises NotConfirmed, and the worker requeues the message rather
than ack it (its rerun finds the record kept: first write wins).
"""

from __future__ import annotations

import math
import time

import redis
from redis.exceptions import InvalidResponse

from conveyor import redis_clients, refusals
from conveyor.broker.redis import parse_url
from conveyor.errors import BrokerError, NotConfirmed
from conveyor.locations import redact
from conveyor.results.base import ResultRecord, ResultStore

#: What a call may meet that is about the server, not the call: an outage, a login refused
#: (redis-py's AuthenticationError is a ConnectionError), another kind of server answering.
FAILED_CONTACT = (redis.ConnectionError, InvalidResponse)


#: `put` in the durable mode: the MULTI's two commands as one script, so that the WAIT
#: after it can share its pipeline (a WAIT inside a MULTI would not wait).
PUT = """
local stored = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
redis.call('PUBLISH', KEYS[1], '1')
if stored then return 1 end
return 0
"""


class RedisResults(ResultStore):
    def __init__(self, url: str) -> None:
        address, self.prefix, _ = parse_url(url)
        self._url = url
        self._client = redis_clients.connect(address, socket_connect_timeout=10)
        self._durable = redis_clients.durable(url)
        self._put = self._client.register_script(PUT)

    def _key(self, message_id: str) -> str:
        return f"{self.prefix}:r:{message_id}"

    def put(self, message_id: str, record: ResultRecord, ttl: float) -> bool:
        key = self._key(message_id)
        if self._durable is not None:
            return self._put_durably(key, record, ttl)
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.set(key, record.encode(), nx=True, px=max(1, math.ceil(ttl * 1000)))
                pipe.publish(key, b"1")
                stored, _ = pipe.execute()
        except FAILED_CONTACT as exc:
            raise self._failed(exc) from None
        return bool(stored)

    def _put_durably(self, key: str, record: ResultRecord, ttl: float) -> bool:
        """`put`, then WAIT for the replicas on the same connection."""
        assert self._durable is not None
        try:
            with self._client.pipeline(transaction=False) as pipe:
                self._put(keys=[key], args=[record.encode(), max(1, math.ceil(ttl * 1000))],
                          client=pipe)
                pipe.execute_command(*self._durable.command())
                stored, acked = pipe.execute()
        except FAILED_CONTACT as exc:
            raise self._failed(exc) from None
        short = self._durable.shortfall(acked, f"result {key}", redact(self._url))
        if short is not None:
            raise NotConfirmed(short)
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
