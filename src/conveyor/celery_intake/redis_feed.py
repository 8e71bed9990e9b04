"""The feed on a Redis Celery broker: batches taken atomically, so a kill -9 loses nothing.

kombu's Redis transport pops one message per round trip (BRPOP) and only then, in a second
round trip, records it in its `unacked` hash: a consumer killed in between has taken a
message nobody will ever deliver again (Celery's own worker has the same window,
celery/kombu#305). This feed takes messages with one Lua script that pops up to `prefetch`
of them and records each in that same `unacked` hash and `unacked_index` (kombu's format:
`[payload, exchange, routing_key]` by delivery tag), in one atomic step. Then, as the kombu
feed does, it publishes the batch to Conveyor and only then removes the batch from
`unacked` (the ack). Messages a killed feed held stay in `unacked`, and an idle feed puts
them back on their queue after the visibility timeout, as kombu's own `restore_visible`
does but without its global mutex (see `_restore_if_due`).

While the queues are empty it blocks on the first one with BLMOVE into a staging list (one
message moved atomically), which the next script call drains first: a feed killed between
the two leaves that message in staging, where the next call of any feed finds it.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import kombu
import redis
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_fixed,
)

from conveyor.celery_intake.conversion import CeleryMessage
from conveyor.celery_intake.feed import publication
from conveyor.client import Client
from conveyor.tasks import Task

log = logging.getLogger("conveyor.celery_intake")

#: How long an idle feed blocks on Celery's queue before it looks again (seconds).
BLOCK_SECONDS = 1
#: How often an idle feed gives back messages a dead consumer held (seconds).
RESTORE_EVERY = 5.0
#: At most this many batches (of `prefetch`) are given back per look.
RESTORE_ROUNDS = 10

TAKE = """
-- KEYS: staging, unacked, unacked_index, then Celery's queue keys, first taken first
-- ARGV: limit, now; returns queue index, tag, payload for each message taken
local limit, now = tonumber(ARGV[1]), ARGV[2]
local out = {}
for k = 1, #KEYS do
  if k ~= 2 and k ~= 3 then
    while #out < 3 * limit do
      local item = redis.call('RPOP', KEYS[k])
      if not item then break end
      local ok, m = pcall(cjson.decode, item)
      local p = ok and type(m) == 'table' and type(m.properties) == 'table' and m.properties
      local tag, saved
      if p and type(p.delivery_tag) == 'string' then
        local info = type(p.delivery_info) == 'table' and p.delivery_info or {}
        tag = p.delivery_tag
        saved = '[' .. item .. ',' .. cjson.encode(info.exchange or '') .. ','
                .. cjson.encode(info.routing_key or '') .. ']'
      else  -- not kombu's envelope: kept, as a string, to be rejected with a reason
        tag = 'conveyor-intake-' .. redis.sha1hex(item)
        saved = cjson.encode({item, '', ''})
      end
      redis.call('ZADD', KEYS[3], now, tag)
      redis.call('HSET', KEYS[2], tag, saved)
      out[#out + 1] = k == 1 and -1 or k - 4
      out[#out + 1] = tag
      out[#out + 1] = item
    end
  end
end
return out
"""


class RedisFeed:
    """Moves Celery's Redis queues into Conveyor in batches; same contract as `Feed`."""

    def __init__(self, connection: kombu.Connection, celery_queues: tuple[str, ...],
                 client: Client, lookup: Callable[[str], Task[Any, Any] | None],
                 reply_to: str = "", prefetch: int = 64, canvas_runs: bool = False) -> None:
        self.connection = connection
        self.celery_queues = celery_queues
        self.client = client
        self.lookup = lookup
        self.reply_to = reply_to
        self.canvas_runs = canvas_runs   # chains and chords start scheduler runs
        self.prefetch = prefetch
        self.fed = 0
        self.should_stop = False
        channel: Any = connection.default_channel  # kombu's Redis Channel
        self._channel = channel
        self._redis = redis.Redis(connection_pool=channel.client.connection_pool)
        prefix = channel.global_keyprefix or ""
        self._unacked = prefix + channel.unacked_key
        self._index = prefix + channel.unacked_index_key
        self._staging = f"{prefix}_conveyor.intake.staging.{celery_queues[0]}"
        self._queue_keys = [(q, prefix + channel._q_for_pri(q, pri))
                            for pri in channel.priority_steps for q in celery_queues]
        self._take = self._redis.register_script(TAKE)
        self._next_restore = 0.0

    def run(self) -> None:
        """Move batches until stopped; wait on Celery's first queue while all are empty.

        While Redis is away a turn is tried again every BLOCK_SECONDS, with one line each
        (tenacity's Retrying, until it works or the feed is told to stop)."""
        turns = Retrying(
            wait=wait_fixed(BLOCK_SECONDS), stop=lambda state: self.should_stop,
            retry=retry_if_exception_type((redis.ConnectionError, redis.TimeoutError)),
            before_sleep=self._say_retrying, retry_error_callback=lambda state: None)
        while not self.should_stop:
            turns(self._turn)
        self.move()

    def _turn(self) -> None:
        if self.move() == 0:
            self._restore_if_due()
            self._redis.blmove(self._queue_keys[0][1], self._staging, BLOCK_SECONDS,
                               "RIGHT", "LEFT")

    @staticmethod
    def _say_retrying(state: RetryCallState) -> None:
        """tenacity's before_sleep: one line per failed turn."""
        assert state.outcome is not None
        log.warning("Celery broker: %s; trying again in %d s (what this feed held is given "
                    "back after the visibility timeout)", state.outcome.exception(),
                    BLOCK_SECONDS)

    def move(self) -> int:
        """Take a batch, publish it to Conveyor, then ack it on Celery's side; how many."""
        keys = [self._staging, self._unacked, self._index, *(k for _, k in self._queue_keys)]
        reply = self._take(keys=keys, args=[self.prefetch, time.time()])
        if not reply:
            return 0
        batch = [(int(reply[i]), reply[i + 1].decode(), reply[i + 2])
                 for i in range(0, len(reply), 3)]
        self.client.broker.publish_many([
            publication(self._raw(where, item), self.client, self.lookup, self.reply_to,
                        self.canvas_runs)
            for where, _tag, item in batch])
        with self._redis.pipeline(transaction=False) as pipe:
            for _where, tag, _item in batch:
                pipe.zrem(self._index, tag)
                pipe.hdel(self._unacked, tag)
            pipe.execute()
        self.fed += len(batch)
        return len(batch)

    def _raw(self, where: int, item: bytes) -> CeleryMessage:
        """The message as kombu would deliver it; `where` -1 means the staging list."""
        queue = self.celery_queues[0] if where < 0 else self._queue_keys[where][0]
        try:
            payload = json.loads(item)
            props = payload["properties"]
            body = payload["body"]
            raw = base64.b64decode(body) if props.get("body_encoding") == "base64" \
                else str(body).encode()
            return CeleryMessage(queue=queue, content_type=payload.get("content-type") or "",
                                 content_encoding=payload.get("content-encoding") or "utf-8",
                                 headers=payload.get("headers") or {}, body=raw,
                                 properties=props)
        except (ValueError, KeyError, TypeError, AttributeError):
            return CeleryMessage(queue=queue, content_type="", content_encoding="binary",
                                 headers={}, body=item)

    def _restore_if_due(self) -> None:
        """Give back what dead consumers held past the visibility timeout, as kombu's
        `restore_visible` does but without its mutex: that lock is one key for every
        consumer of this Redis and lives 5 minutes, so a Celery worker or feed killed while
        holding it stopped every restore for that long (a batch a killed feed held stayed
        invisible). Each `restore_by_tag` is a WATCH transaction, safe beside any other
        restorer: a message is put back once."""
        now = time.monotonic()
        if now < self._next_restore:
            return
        self._next_restore = now + RESTORE_EVERY
        ceil = time.time() - self._channel.visibility_timeout
        for _ in range(RESTORE_ROUNDS):
            tags: list[bytes] = self._redis.zrange(  # type: ignore[assignment]
                self._index, ceil, 0, desc=True, byscore=True, offset=0, num=self.prefetch)
            for tag in tags:
                self._channel.qos.restore_by_tag(tag.decode())
            if len(tags) < self.prefetch:
                return
