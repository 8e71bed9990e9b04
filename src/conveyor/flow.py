"""Flow control as a task declares it: `Limit` (concurrency per key) and `Rate` (a token
bucket per key), and how a message carries them.

    @task(concurrency=Limit(key="tenant:{tenant_id}", max=2),
          rate=Rate(key="partner-api", per_second=10, burst=20))
    def sync_tenant(tenant_id: str) -> None: ...

A key is a template over the task's arguments, formatted at enqueue time; the message then
carries its resolved limits in one header (`LIMITS_HEADER`), so a worker needs nothing but
the message to enforce them, and a message without the header (an unlimited task) never
touches the limiter's store. The limiter itself lives in `conveyor.limits`.
"""

from __future__ import annotations

import inspect
import json
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError

#: The message header holding the resolved limits (JSON); absent: the task is unlimited.
LIMITS_HEADER = "limits"
#: Set by a worker that reserved the message's rate slot: "<attempt>", so that attempt runs
#: when it comes back without being counted twice (a retry is a new attempt and counts).
RATE_RESERVED_HEADER = "rate-reserved"
#: The message's unique key (`enqueue(..., unique_key=...)`) while it holds the key until its
#: outcome: the worker gives the key back when it settles a terminal one. Absent when the key
#: is held for a fixed window (`unique_for`), which nothing but time ends.
UNIQUE_HEADER = "unique"
#: How long a unique key without a window is held at most, after its message's delay: the
#: backstop for a holder that never reaches a worker's terminal settle (its queue purged or
#: deleted, its outcome lost with the worker's store); see README "Once per key".
UNIQUE_HOLD = 24 * 3600.0


@dataclass(frozen=True)
class Limit:
    """At most `max` tasks whose key formats the same run at once, across every worker.

    A pool (Airflow's) is a Limit whose key is `pool:<name>`; `weight` is how many of its
    slots one task takes.
    """

    key: str
    max: int = 1
    weight: int = 1

    def __post_init__(self) -> None:
        _check_key(self.key)
        if self.max < 1 or self.weight < 1:
            raise ConfigError(f"Limit(key={self.key!r}): max and weight must be at least 1 "
                              f"(got max={self.max}, weight={self.weight})")


@dataclass(frozen=True)
class Rate:
    """At most `per_second` starts a second per key, globally; `burst` may start at once."""

    key: str
    per_second: float
    burst: int = 1

    def __post_init__(self) -> None:
        _check_key(self.key)
        if self.per_second <= 0 or self.burst < 1:
            raise ConfigError(f"Rate(key={self.key!r}): per_second must be above 0 and burst "
                              f"at least 1 (got per_second={self.per_second}, "
                              f"burst={self.burst})")


@dataclass(frozen=True)
class Spec:
    """One resolved limit of one message: kind "c" (concurrency) or "r" (rate)."""

    kind: str
    key: str
    max: int = 0
    weight: int = 1
    per_second: float = 0.0
    burst: int = 1

    def wire(self) -> dict[str, Any]:
        if self.kind == "c":
            return {"k": "c", "key": self.key, "max": self.max, "w": self.weight}
        return {"k": "r", "key": self.key, "ps": self.per_second, "b": self.burst}


def _check_key(template: str) -> None:
    if not template or not isinstance(template, str):
        raise ConfigError(f"a limit key must be a non-empty string, got {template!r}")
    try:
        list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"limit key {template!r} is not a valid template ({exc}); "
                          "write e.g. 'tenant:{tenant_id}'") from None


def fields_of(template: str) -> list[str]:
    """The argument names a key template refers to ('tenant:{t.id}' -> ['t'])."""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    return [n.split(".")[0].split("[")[0] for n in names]


def check_templates(fn: Callable[..., Any], limits: Sequence[Limit | Rate]) -> None:
    """At decoration: every name a key template uses must be a parameter of `fn`."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for limit in limits:
        for name in fields_of(limit.key):
            if not name or name.isdigit():
                raise ConfigError(f"limit key {limit.key!r} of {fn.__qualname__}: name the "
                                  "argument, e.g. {tenant_id}; positional {} is not allowed")
            if name not in params and not takes_any:
                raise ConfigError(f"limit key {limit.key!r} of {fn.__qualname__}: it has no "
                                  f"argument {name!r} (arguments: {', '.join(params)})")


def resolve(fn: Callable[..., Any] | None, limits: Sequence[Limit | Rate],
            args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Spec]:
    """The limits of one call, keys formatted from its bound arguments (from `kwargs` alone
    without a function: a command's keys)."""
    values: dict[str, Any] = dict(kwargs)
    if fn is not None and any(fields_of(limit.key) for limit in limits):
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise ConfigError(f"{fn.__qualname__}: these arguments do not fit its "
                              f"signature ({exc}), so its limit keys cannot be "
                              "formatted") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        for p in inspect.signature(fn).parameters.values():
            if p.kind == p.VAR_KEYWORD:
                values.update(values.pop(p.name, {}))
    return [_spec(limit, values) for limit in limits]


def _spec(limit: Limit | Rate, values: Mapping[str, Any]) -> Spec:
    try:
        key = limit.key.format_map(values)
    except (KeyError, AttributeError, IndexError, ValueError) as exc:
        raise ConfigError(f"limit key {limit.key!r} cannot be formatted from the task's "
                          f"arguments ({type(exc).__name__}: {exc})") from None
    if isinstance(limit, Limit):
        return Spec("c", key, max=limit.max, weight=limit.weight)
    return Spec("r", key, per_second=limit.per_second, burst=limit.burst)


def unique_key_of(fn: Callable[..., Any], key: str | Callable[..., Any],
                  args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """A task's unique key for one call: `key(*args, **kwargs)` when it is a function, else
    the template (`"invoice:{invoice_id}"`) formatted from the bound arguments, as limit keys
    are."""
    if callable(key):
        return str(key(*args, **kwargs))
    return resolve(fn, [Limit(key=key)], args, kwargs)[0].key


def check_unique_key(fn: Callable[..., Any], key: str | Callable[..., Any] | None) -> None:
    """At decoration: a template's names must be arguments of `fn` (as for limit keys)."""
    if isinstance(key, str):
        check_templates(fn, [Limit(key=key)])


def encode(specs: Sequence[Spec]) -> str:
    """The header value for `specs`."""
    return json.dumps([s.wire() for s in specs], separators=(",", ":"))


def decode(text: str) -> list[Spec]:
    """The specs a header holds; ValueError if it is not one this worker can read."""
    out = []
    for item in json.loads(text):
        if item["k"] == "c":
            out.append(Spec("c", str(item["key"]), max=int(item["max"]),
                            weight=int(item.get("w", 1))))
        elif item["k"] == "r":
            out.append(Spec("r", str(item["key"]), per_second=float(item["ps"]),
                            burst=int(item.get("b", 1))))
        else:
            raise ValueError(f"unknown limit kind {item['k']!r}")
    return out


def limits_of(headers: Mapping[str, str]) -> list[Spec]:
    """The message's limits (empty: unlimited)."""
    text = headers.get(LIMITS_HEADER)
    return decode(text) if text else []


__all__ = ["LIMITS_HEADER", "RATE_RESERVED_HEADER", "UNIQUE_HEADER", "UNIQUE_HOLD", "Limit",
           "Rate", "Spec", "check_templates", "check_unique_key", "decode", "encode",
           "limits_of", "resolve", "unique_key_of"]
