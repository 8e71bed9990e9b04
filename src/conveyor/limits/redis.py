"""The Redis limiter: every operation is one Lua script call (`lua/limits.lua`), so each is
atomic on the server however many workers call it at once.

URL: the broker's own, `redis://host:6379/0?prefix=conveyor`: keys live under
`<prefix>:{limits}:`. Redis Cluster: every key carries the hash tag `{limits}` (or the
prefix's own, which comes first), so all of one limiter's keys share one hash slot, and each
script call names its key set in KEYS, by which a cluster client routes it. A call touches
several keys atomically (a message's limits are taken all or none; the sweep walks every
key), so one slot is the price; the script derives the other names from the prefix, within
that slot, which Redis Cluster runs (a proxy that insists on every key in KEYS would refuse
it). The client is redis-py's single-node one: a cluster client is not wired in.

Clocks: times are the callers' (`now`); workers on machines whose clocks disagree by more
than a fraction of a lease should run NTP, as for any lease.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor import redis_clients, refusals
from conveyor.errors import ConfigError
from conveyor.flow import Spec, encode
from conveyor.limits.base import RATE_SLACK, Decision, Limiter, Override, Parcel, Usage
from conveyor.locations import redact


def parse_url(url: str) -> tuple[str, str]:
    """(URL for redis-py, key prefix)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = dict(query).get("prefix", "conveyor")
    if not prefix or any(c.isspace() for c in prefix) or "{}" in prefix:
        raise ConfigError(f"limits URL {redact(url)!r}: prefix={prefix!r} must be a "
                          "non-empty word (and without '{}', which would undo the hash tag)")
    rest = [(k, v) for k, v in query
            if k not in ("prefix", "retry_seconds", "reconnect_timeout")]
    return urlunsplit(parts._replace(query=urlencode(rest))), prefix


#: `Limiter.hold`: the holder after taking the key if it was free.
HOLD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return ARGV[1] end
return redis.call('GET', KEYS[1])
"""
#: `Limiter.unhold`: delete the key only if this holder still has it.
UNHOLD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: `Limiter.cancel`: KEYS[1] id -> expiry, KEYS[2] id -> when recorded; lapsed ones dropped.
CANCEL = """
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
  redis.call('ZREM', KEYS[2], unpack(gone))
end
if redis.call('ZADD', KEYS[1], 'NX', ARGV[3], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  return 1
end
return 0
"""


class RedisLimiter(Limiter):
    """Limits kept in Redis beside (or apart from) the broker's keys."""

    def __init__(self, url: str) -> None:
        plain, prefix = parse_url(url)
        self.prefix = f"{prefix}:{{limits}}"  # one hash slot: see the module docstring
        self._redis: Any = redis_clients.connect(plain, socket_connect_timeout=10)
        refusals.first_redis_contact(self._redis, f"the limits store: Redis at {redact(plain)}")
        text = resources.files("conveyor.limits").joinpath("lua/limits.lua").read_text()
        self._script = self._redis.register_script(text)
        self._hold = self._redis.register_script(HOLD)
        self._unhold = self._redis.register_script(UNHOLD)
        self._cancel = self._redis.register_script(CANCEL)

    def _call(self, op: str, now: float, lease: float, *args: Any) -> Any:
        return self._script(keys=[f"{self.prefix}:keys"],
                            args=[self.prefix, op, repr(now), repr(lease), *args])

    def admit(self, parcel: Parcel, specs: Sequence[Spec], now: float, lease: float, *,
              rate_reserved: bool = False) -> Decision:
        verdict, key, delay = self._call(
            "admit", now, lease, encode(specs), parcel.id, parcel.queue, parcel.body,
            str(parcel.priority), "1" if rate_reserved else "0", repr(RATE_SLACK))
        return Decision(verdict.decode(), key.decode(), float(delay))

    def park_many(self, items: Sequence[tuple[Parcel, Sequence[Spec]]],
                  now: float) -> list[str]:
        if not items:
            return []
        args = [part for parcel, specs in items for part in (
            encode(specs), parcel.id, parcel.queue, parcel.body, str(parcel.priority))]
        return [k.decode() for k in self._call("park_many", now, 0.0, *args)]

    def release(self, holder: str, specs: Sequence[Spec], now: float,
                lease: float) -> list[Parcel]:
        keys = [s.key for s in specs if s.kind == "c"]
        if not keys:
            return []
        return _parcels(self._call("release", now, lease, holder, *keys))

    def renew(self, held: Sequence[tuple[str, Sequence[Spec]]], now: float,
              lease: float) -> None:
        pairs = [part for holder, specs in held for s in specs if s.kind == "c"
                 for part in (s.key, holder)]
        if pairs:
            self._call("renew", now, lease, *pairs)

    def sweep(self, now: float, lease: float) -> list[Parcel]:
        return _parcels(self._call("sweep", now, lease))

    def moved(self, ids: Sequence[str]) -> None:
        if ids:
            self._call("moved", 0.0, 0.0, *ids)

    def hold(self, key: str, holder: str, now: float, ttl: float) -> str:
        """`SET NX PX` and, when it was held, `GET`, in one script; the time to live runs
        on the Redis server's clock (`now` is not used)."""
        found = self._hold(keys=[f"{self.prefix}:unique:{key}"],
                           args=[holder, max(1, round(ttl * 1000))])
        return bytes(found).decode()

    def unhold(self, key: str, holder: str) -> None:
        self._unhold(keys=[f"{self.prefix}:unique:{key}"], args=[holder])

    def cancel(self, message_id: str, now: float, ttl: float) -> bool:
        return bool(self._cancel(keys=[f"{self.prefix}:cancel", f"{self.prefix}:cancel_at"],
                                 args=[message_id, repr(now), repr(now + ttl)]))

    def cancels(self, now: float, since: float = 0.0) -> list[str]:
        pipe = self._redis.pipeline()
        pipe.zrangebyscore(f"{self.prefix}:cancel_at", since, "+inf")
        pipe.zrangebyscore(f"{self.prefix}:cancel", f"({now!r}", "+inf")
        recent, live = pipe.execute()
        alive = set(live)
        return [m.decode() for m in recent if m in alive]

    def set_limit(self, key: str, override: Override) -> None:
        values = {k: repr(v) for k, v in (("max", override.max),
                                          ("per_second", override.per_second),
                                          ("burst", override.burst)) if v is not None}
        pipe = self._redis.pipeline()
        pipe.hset(f"{self.prefix}:set:{key}", mapping=values)
        pipe.sadd(f"{self.prefix}:keys", key)
        pipe.execute()

    def clear(self, key: str) -> bool:
        return bool(self._redis.delete(f"{self.prefix}:set:{key}"))

    def usage(self, now: float) -> list[Usage]:
        p, r = self.prefix, self._redis
        out = []
        for key in sorted(k.decode() for k in r.smembers(f"{p}:keys")):
            live = r.zrangebyscore(f"{p}:tok:{key}", now, "+inf")
            weights = r.hmget(f"{p}:w:{key}", live) if live else []
            decl = json.loads(r.hget(f"{p}:decl", key) or b"{}")
            over = {k.decode(): v.decode() for k, v in r.hgetall(f"{p}:set:{key}").items()}
            out.append(Usage(key, sum(int(w or 1) for w in weights),
                             int(r.zcard(f"{p}:park:{key}")),
                             int(r.hget(f"{p}:denied", key) or 0),
                             holders=tuple(sorted(h.decode() for h in live)),
                             **_shown(decl, over)))
        return out

    def close(self) -> None:
        self._redis.close()


def _shown(decl: dict[str, Any], over: dict[str, str]) -> dict[str, Any]:
    """The limit in force for `conveyor limits list`: the override, else the declared."""
    shown: dict[str, Any] = {"overridden": bool(over)}
    if "max" in over or decl.get("k") == "c":
        shown["max"] = int(float(over.get("max", decl.get("max", 0))))
    if "per_second" in over or decl.get("k") == "r":
        shown["per_second"] = float(over.get("per_second", decl.get("ps", 0)))
        shown["burst"] = int(float(over.get("burst", decl.get("b", 1))))
    return shown


def _parcels(flat: list[bytes]) -> list[Parcel]:
    return [Parcel(flat[i].decode(), flat[i + 1].decode(), flat[i + 3], int(flat[i + 2]))
            for i in range(0, len(flat), 4)]
