"""The limiter seam: one small interface, one module per store where its state is atomic.

Semantics every backend keeps (checked by one contract suite, `tests/contract/`):

* `admit` takes all of a message's limits at once or none: concurrency tokens are held by
  the message id (a redelivered attempt re-admits idempotently and never counts twice) and
  expire `lease` seconds after they were taken or renewed, so a worker killed with -9 gives
  them back when its lease lapses;
* a message whose concurrency key is full is parked in that key's waiting area (durably,
  once per message id) and holds nothing; the worker then acks it off the broker, so it
  occupies no slot and nobody spins on it;
* a rate-limited message is given a reservation (GCRA: a token bucket with `burst`) and is
  told how long to wait; the worker re-publishes it with that delay, marked as reserved;
* `release` (and `sweep`, for tokens whose lease lapsed) hands each freed token straight to
  the oldest parked message of its key and returns those messages to be published again;
  they stay in the store, marked moving, until `moved` says they were published, and a
  later `sweep` offers them again if that never came (at-least-once, never loss);
* a key's state is deleted (by `release`, and by `sweep` for lapsed tokens and rate keys)
  once nothing holds or waits on it, it has no override and its rate bucket is full again
  (GCRA's tat <= now: the same as no bucket): keys formatted from templates
  (`tenant:{tenant_id}`) come and go with their work instead of piling up; `usage` lists
  the keys that have state, and a key's denied count starts over after it was forgotten.

Times are Unix seconds passed in by the caller (`now`), never read from a clock in here.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.errors import ConfigError
from conveyor.flow import Spec

#: A rate delay shorter than this is not worth a round trip through the broker.
RATE_SLACK = 0.005


@dataclass(frozen=True)
class Parcel:
    """A message as the limiter keeps it: enough to publish it again as it was."""

    id: str
    queue: str
    body: bytes
    priority: int = 0


@dataclass(frozen=True)
class Decision:
    """What `admit` decided: "run", "parked" (on `key`) or "delayed" (by `delay` seconds)."""

    verdict: str
    key: str = ""
    delay: float = 0.0

    @property
    def granted(self) -> bool:
        return self.verdict == "run"


@dataclass(frozen=True)
class Usage:
    """One key as `conveyor limits list`, /metrics and the dashboard's Limits page show it;
    `holders`: the message ids holding its live concurrency tokens, sorted."""

    key: str
    in_use: int
    waiting: int
    denied: int
    max: int | None = None
    per_second: float | None = None
    burst: int | None = None
    overridden: bool = False
    holders: tuple[str, ...] = ()

    @property
    def limit(self) -> str:
        """The limit in force as people read it: "max 2", "5/s burst 10", or "-"."""
        parts = []
        if self.max is not None:
            parts.append(f"max {self.max}")
        if self.per_second is not None:
            parts.append(f"{self.per_second:g}/s"
                         + (f" burst {self.burst}" if self.burst and self.burst > 1 else ""))
        return ", ".join(parts) or "-"


@dataclass(frozen=True)
class Override:
    """A limit set at run time (`conveyor limits set`); it wins over the declared one."""

    max: int | None = None
    per_second: float | None = None
    burst: int | None = None

    def checked(self, key: str) -> Override:
        """This override, or a ConfigError saying which value is wrong (the CLI's flags and
        the dashboard's form both come through here)."""
        if self.max is None and self.per_second is None and self.burst is None:
            raise ConfigError(f"limits set {key}: give --max, --per-second or --burst")
        if self.max is not None and self.max < 1:
            raise ConfigError(f"limits set {key}: max must be a whole number above 0, got "
                              f"{self.max}")
        if self.per_second is not None and not self.per_second > 0:
            raise ConfigError(f"limits set {key}: per_second must be a number of starts a "
                              f"second above 0, got {self.per_second}")
        if self.burst is not None and self.burst < 1:
            raise ConfigError(f"limits set {key}: burst must be a whole number above 0, got "
                              f"{self.burst}")
        return self

    def describe(self) -> str:
        """What it sets, as people read it ("max 2", "5/s burst 10")."""
        return Usage("", 0, 0, 0, self.max, self.per_second, self.burst).limit


class Limiter(abc.ABC):
    """Global concurrency and rate limits, shared by every worker through one store."""

    @abc.abstractmethod
    def admit(self, parcel: Parcel, specs: Sequence[Spec], now: float, lease: float, *,
              rate_reserved: bool = False) -> Decision:
        """Take every limit of `specs` for `parcel.id`, or park it, or delay it."""

    @abc.abstractmethod
    def park_many(self, items: Sequence[tuple[Parcel, Sequence[Spec]]],
                  now: float) -> list[str]:
        """Park each parcel whose concurrency key is full, all in one step; for each item
        the key it was parked on, or "" if it was left alone (room, or it holds its token).

        Why: a worker that finds a key full claims a batch of the queue and parks the
        messages behind it in one store transaction instead of one per claim, so another
        key's message behind a backlog of thousands is reached within milliseconds. Nothing
        is granted here: those left alone go through `admit` as usual. Parking is once per
        message id, as in `admit` (a batch redelivered after a crash parks nothing twice).
        """

    @abc.abstractmethod
    def release(self, holder: str, specs: Sequence[Spec], now: float,
                lease: float) -> list[Parcel]:
        """Give back `holder`'s tokens; the parked messages they were handed to."""

    @abc.abstractmethod
    def renew(self, held: Sequence[tuple[str, Sequence[Spec]]], now: float,
              lease: float) -> None:
        """Heartbeat: keep each (holder, specs)'s tokens `lease` seconds more."""

    @abc.abstractmethod
    def sweep(self, now: float, lease: float) -> list[Parcel]:
        """Free lapsed tokens; the parked messages handed a token, and moving ones whose
        publication was never confirmed."""

    @abc.abstractmethod
    def moved(self, ids: Sequence[str]) -> None:
        """These handed-over messages are on their queues again: forget them."""

    # -- once per key (`unique_key` on enqueue) ---------------------------------------------

    @abc.abstractmethod
    def hold(self, key: str, holder: str, now: float, ttl: float) -> str:
        """Take the unique key `key` for message `holder` until `now + ttl`, unless another
        message holds it and its time has not run out: the holder after the call (`holder`
        itself when it took the key). Atomic: of producers racing for one key, one wins and
        the others all see the winner."""

    @abc.abstractmethod
    def unhold(self, key: str, holder: str) -> None:
        """Give back `key` if `holder` still holds it (a later holder's is left alone)."""

    # -- cancel records (`Client.cancel`) ---------------------------------------------------

    @abc.abstractmethod
    def cancel(self, message_id: str, now: float, ttl: float) -> bool:
        """Record `message_id` as cancelled until `now + ttl` (an expiry backstop: records
        do not pile up for ever); False when it was recorded already (nothing changes).
        Records whose time ran out are deleted here."""

    @abc.abstractmethod
    def cancels(self, now: float, since: float = 0.0) -> list[str]:
        """The ids of live cancel records made at `since` or later (a worker reads them all
        at start, then those it may have missed; see conveyor/control)."""

    # -- operators ------------------------------------------------------------------------

    @abc.abstractmethod
    def set_limit(self, key: str, override: Override) -> None:
        """Override the declared limit of `key` (fields left None keep theirs)."""

    @abc.abstractmethod
    def clear(self, key: str) -> bool:
        """Drop `key`'s override; whether there was one."""

    @abc.abstractmethod
    def usage(self, now: float) -> list[Usage]:
        """Every key known to the store, by name."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""


def gcra(tat: float, now: float, per_second: float, burst: int) -> tuple[float, float]:
    """(start, new_tat): when a request arriving at `now` may start, and the bucket after.

    The generic cell rate algorithm: one theoretical arrival time per key; a request may
    start at max(now, tat - (burst - 1) * interval) and pushes tat one interval on.
    """
    interval = 1.0 / per_second
    start = max(now, tat - (burst - 1) * interval)
    return start, max(tat, now) + interval
