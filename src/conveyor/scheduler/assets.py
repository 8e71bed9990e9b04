"""Assets and events: what a DAG run can be started by besides cron (Airflow 3's assets).

    from conveyor import DAG, Asset, Event

    orders = Asset("s3://lake/orders")
    produce = DAG("extract")
    produce.task(extract_orders, outlets=[orders])     # its success records an asset event

    report = DAG("report", schedule=orders & Asset("s3://lake/payments"))
    alerts = DAG("alerts", schedule=Event("invoice.paid"))   # one run per event, payload=conf

A condition is an `Asset`, an `Event`, or `&` / `|` of conditions (a list means `&`). A DAG
scheduled on one gets a run when its condition holds over the events queued for it since its
last such run; the run consumes them all (`context.triggering_asset_events`). A DAG scheduled
on events alone (`Event`, or `|` of events) gets one run per event, the payload as its conf.

These are plain values, JSON-able through `spec()` / `from_spec()`: what the store records
and the engine evaluates (`scheduler/asset_runs.py`) is the same thing the DAG file wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError

#: How an `Event` is keyed among asset URIs (an asset URI may not use this scheme); the
#: state store's (state/assets.py) is the same, a test says so.
EVENT_PREFIX = "event:"
MAX_KEY = 1000


class Condition:
    """Something a DAG can be scheduled on; combine with `&` (all) and `|` (any)."""

    def __and__(self, other: Condition) -> Condition:
        return AllOf((self, _condition(other)))

    def __or__(self, other: Condition) -> Condition:
        return AnyOf((self, _condition(other)))

    def keys(self) -> set[str]:
        """The asset URIs and event keys it reads."""
        raise NotImplementedError

    def met(self, present: set[str]) -> bool:
        """Whether it holds when the keys in `present` have an event each (at least)."""
        raise NotImplementedError

    def spec(self) -> Any:
        raise NotImplementedError

    def events_only(self) -> bool:
        """An event, or `|` of events: one run per event (its payload as the run's conf)."""
        return False


@dataclass(frozen=True)
class Asset(Condition):
    """A piece of data named by its URI (`s3://lake/orders`, `postgres://db/table`, ...)."""

    uri: str

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri.strip() or len(self.uri) > MAX_KEY:
            raise ConfigError(f"Asset URI {self.uri!r} must be a non-empty string of at most "
                              f"{MAX_KEY} characters, e.g. Asset('s3://lake/orders')")
        if self.uri.startswith(EVENT_PREFIX):
            raise ConfigError(f"Asset URI {self.uri!r} starts with {EVENT_PREFIX!r}, which "
                              "names events: use Event('name') for an event")

    @property
    def key(self) -> str:
        return self.uri

    def keys(self) -> set[str]:
        return {self.uri}

    def met(self, present: set[str]) -> bool:
        return self.uri in present

    def spec(self) -> Any:
        return {"asset": self.uri}

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True)
class Event(Condition):
    """A named business event (`invoice.paid`), sent with `conveyor events send`."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or \
                len(self.name) > MAX_KEY - len(EVENT_PREFIX):
            raise ConfigError(f"Event name {self.name!r} must be a non-empty string, "
                              "e.g. Event('invoice.paid')")

    @property
    def key(self) -> str:
        return event_key(self.name)

    def keys(self) -> set[str]:
        return {self.key}

    def met(self, present: set[str]) -> bool:
        return self.key in present

    def spec(self) -> Any:
        return {"event": self.name}

    def events_only(self) -> bool:
        return True

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class AllOf(Condition):
    """Every part holds (Airflow's `&`; a list of assets means this)."""

    parts: tuple[Condition, ...]

    def __and__(self, other: Condition) -> Condition:
        return AllOf((*self.parts, _condition(other)))

    def keys(self) -> set[str]:
        return set().union(*(p.keys() for p in self.parts))

    def met(self, present: set[str]) -> bool:
        return all(p.met(present) for p in self.parts)

    def spec(self) -> Any:
        return {"all": [p.spec() for p in self.parts]}

    def __str__(self) -> str:
        return "(" + " & ".join(map(str, self.parts)) + ")"


@dataclass(frozen=True)
class AnyOf(Condition):
    """At least one part holds (Airflow's `|`)."""

    parts: tuple[Condition, ...]

    def __or__(self, other: Condition) -> Condition:
        return AnyOf((*self.parts, _condition(other)))

    def keys(self) -> set[str]:
        return set().union(*(p.keys() for p in self.parts))

    def met(self, present: set[str]) -> bool:
        return any(p.met(present) for p in self.parts)

    def spec(self) -> Any:
        return {"any": [p.spec() for p in self.parts]}

    def events_only(self) -> bool:
        return all(p.events_only() for p in self.parts)

    def __str__(self) -> str:
        return "(" + " | ".join(map(str, self.parts)) + ")"


def event_key(name: str) -> str:
    """The key an event named `name` is recorded under (beside asset URIs)."""
    return EVENT_PREFIX + name


def _condition(value: Any) -> Condition:
    if isinstance(value, Condition):
        return value
    raise ConfigError(f"{value!r} is not an Asset, an Event or a condition of them")


def condition_of(schedule: Condition | Sequence[Condition]) -> Condition:
    """A DAG's `schedule=` as a condition: a list means all of its parts."""
    if isinstance(schedule, Condition):
        return schedule
    if not isinstance(schedule, (list, tuple)):
        raise ConfigError(f"schedule={schedule!r}: give a cron expression, an Asset(...) or "
                          "Event(...), a condition of them (a & b, a | b), or a list of them")
    parts = [_condition(part) for part in schedule]
    if not parts:
        raise ConfigError("schedule=[] names no asset: give Asset(...)s or Event(...)s")
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def from_spec(spec: Any) -> Condition:
    """The condition `Condition.spec()` wrote."""
    if isinstance(spec, Mapping):
        if "asset" in spec:
            return Asset(spec["asset"])
        if "event" in spec:
            return Event(spec["event"])
        if "all" in spec:
            return AllOf(tuple(from_spec(p) for p in spec["all"]))
        if "any" in spec:
            return AnyOf(tuple(from_spec(p) for p in spec["any"]))
    raise ConfigError(f"{spec!r} is not an asset condition")


def outlet_uris(outlets: Iterable[Any]) -> list[str]:
    """The URIs of a task's `outlets=` (Assets only: a task produces data, not events)."""
    found = []
    for outlet in outlets:
        if not isinstance(outlet, Asset):
            raise ConfigError(f"outlets takes Asset(...)s, not {outlet!r}")
        found.append(outlet.uri)
    return sorted(set(found))
