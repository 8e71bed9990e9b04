"""Asset and event records: the events, which DAG consumes and produces each URI, and the
events queued for each consuming DAG (see migration 0017 in sql/*.sql)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError
from conveyor.state.store import Repository, Row, Store

#: The key a named event is recorded under, beside asset URIs (scheduler/assets.py's
#: EVENT_PREFIX: kept equal by a test; this layer cannot import the scheduler's).
EVENT_PREFIX = "event:"
#: Longest asset URI (scheduler/assets.py's MAX_KEY).
MAX_URI = 1000


def event_key(name: str) -> str:
    """The key an event named `name` is recorded under."""
    return EVENT_PREFIX + name


def asset_uri(uri: str) -> str:
    """`uri` as an asset touched from outside may name it, or a ConfigError saying why not
    (an `event:` URI is a named event's: those are sent, with their dedupe keys)."""
    uri = uri.strip()
    if not uri or len(uri) > MAX_URI:
        raise ConfigError(f"asset URI {uri!r} must be 1-{MAX_URI} characters, e.g. "
                          "s3://lake/orders")
    if uri.startswith(EVENT_PREFIX):
        raise ConfigError(f"{uri!r} names an event, not an asset: send it with `conveyor "
                          f"events send {uri[len(EVENT_PREFIX):]}` (Client.send_event)")
    return uri


def record_event(store: Store, uri: str, extra: Mapping[str, Any], now: float, *,
                 source: str, dedupe_key: str | None = None) -> tuple[int, bool]:
    """Record an event of `uri` from outside a task (queued for its consumers) in a
    transaction of its own; (its id, whether it is new): a `dedupe_key` already recorded
    for `uri` records nothing and gives the first one's id."""
    with store.transaction():
        assets = Assets(store)
        event_id = assets.record(uri, extra, now, source=source, dedupe_key=dedupe_key)
        if event_id is not None:
            return event_id, True
        first = assets.by_key(uri, dedupe_key) if dedupe_key else None
        return (first.event_id if first else 0), False


@dataclass(frozen=True)
class AssetEvent:
    """One recorded event of an asset (or a named event: its uri is `event:NAME`)."""

    event_id: int
    uri: str
    extra: dict[str, Any]
    source: str           # "task", "cli", "client", "api"
    dag_id: str | None    # the producing task's, for a task's outlet
    run_id: str | None
    task_id: str | None
    dedupe_key: str | None
    created_at: float

    @classmethod
    def from_row(cls, row: Row) -> AssetEvent:
        return cls(event_id=int(row["event_id"]), uri=row["uri"],
                   extra=json.loads(row["extra"]), source=row["source"],
                   dag_id=row["dag_id"], run_id=row["run_id"], task_id=row["task_id"],
                   dedupe_key=row["dedupe_key"], created_at=float(row["created_at"]))

    def doc(self) -> dict[str, Any]:
        """As the run's context, `assets show` and the JSON API give it."""
        return {"event_id": self.event_id, "uri": self.uri, "extra": self.extra,
                "source": self.source, "dag_id": self.dag_id, "run_id": self.run_id,
                "task_id": self.task_id, "dedupe_key": self.dedupe_key,
                "created_at": self.created_at}


class Assets(Repository):
    """Typed methods over the asset queries."""

    def record(self, uri: str, extra: Mapping[str, Any], now: float, *, source: str,
               dag_id: str | None = None, run_id: str | None = None,
               task_id: str | None = None, dedupe_key: str | None = None) -> int | None:
        """Record an event and queue it for each DAG consuming `uri` (the caller's
        transaction); its id, or None when `dedupe_key` was recorded for `uri` before."""
        row = self.store.one("insert_asset_event", uri=uri, extra=json.dumps(dict(extra)),
                             source=source, dag_id=dag_id, run_id=run_id, task_id=task_id,
                             dedupe_key=dedupe_key, now=now)
        if row is None:
            return None
        event_id = int(row["event_id"])
        self.store.exec("queue_asset_event", event_id=event_id, uri=uri)
        return event_id

    def by_key(self, uri: str, dedupe_key: str) -> AssetEvent | None:
        row = self.store.one("asset_event_by_key", uri=uri, dedupe_key=dedupe_key)
        return None if row is None else AssetEvent.from_row(row)

    def queued(self, limit: int) -> dict[str, list[AssetEvent]]:
        """The events waiting for each consuming DAG, oldest first."""
        found: dict[str, list[AssetEvent]] = {}
        for row in self.store.rows("asset_queue", limit=limit):
            found.setdefault(row["consumer"], []).append(AssetEvent.from_row(row))
        return found

    def queued_counts(self) -> dict[str, int]:
        """How many events wait for each consuming DAG's condition."""
        return {row["dag_id"]: int(row["n"]) for row in self.store.rows("asset_queue_counts")}

    def consume(self, dag_id: str, first: int, last: int) -> int:
        """Take the DAG's queued events with ids first..last; how many there were."""
        return self.store.exec("consume_asset_events", dag_id=dag_id, first=first, last=last)

    def set_refs(self, dag_id: str, consumes: Sequence[str], produces: Sequence[str]) -> None:
        """What `dag_id` consumes and produces now; events queued for a URI it no longer
        consumes are dropped."""
        self.store.exec("forget_asset_refs", dag_id=dag_id)
        self.store.exec_many("insert_asset_ref", [
            {"dag_id": dag_id, "uri": uri, "role": role}
            for role, uris in (("consumes", consumes), ("produces", produces))
            for uri in sorted(set(uris))])
        self.store.exec("prune_asset_queue", dag_id=dag_id)

    def listing(self) -> list[Row]:
        """Every URI known (referenced by a DAG or with events): counts and last event."""
        return self.store.rows("asset_list")

    def refs(self) -> list[Row]:
        return self.store.rows("asset_refs")

    def events(self, uri: str, limit: int = 20) -> list[AssetEvent]:
        """The latest events of `uri`, newest first."""
        return [AssetEvent.from_row(row)
                for row in self.store.rows("asset_events_of", uri=uri, limit=limit)]

    def last_event_id(self) -> int:
        """The newest event's id (0 with none)."""
        row = self.store.one("asset_event_last")
        return int(row["event_id"]) if row else 0

    def first_since(self, uri: str, since: float, upto: int) -> AssetEvent | None:
        """The first event of `uri` recorded after `since`, with an id up to `upto`."""
        row = self.store.one("asset_event_since", uri=uri, since=since, upto=upto)
        return None if row is None else AssetEvent.from_row(row)

    def after(self, event_id: int, limit: int, upto: int = 2**62) -> list[AssetEvent]:
        """The events after `event_id` (up to `upto`), oldest first."""
        return [AssetEvent.from_row(row) for row in self.store.rows(
            "asset_events_after", after=event_id, upto=upto, limit=limit)]
