"""Assets as operators see them (`conveyor assets list/show`, the dashboard's Assets page
and its JSON API): which DAG produces and which consumes each, how many events it has, the
latest of them, and how many wait for a consuming DAG's condition."""

from __future__ import annotations

from typing import Any

from conveyor.scheduler.runs import iso
from conveyor.state.assets import EVENT_PREFIX, Assets
from conveyor.state.store import Store


def asset_rows(store: Store) -> list[dict[str, Any]]:
    """One row per URI a DAG references or an event named (`event:NAME` for events)."""
    assets = Assets(store)
    refs = _refs(assets)
    return [{"uri": row["uri"], "kind": _kind(row["uri"]),
             "producers": refs.get((row["uri"], "produces"), []),
             "consumers": refs.get((row["uri"], "consumes"), []),
             "events": int(row["events"]), "queued": int(row["queued"]),
             "last_event": iso(row["last_event_at"])}
            for row in assets.listing()]


def asset_doc(store: Store, uri: str, limit: int = 20) -> dict[str, Any] | None:
    """One URI: its producers and consumers and its latest events (None: never heard of)."""
    found = next((row for row in asset_rows(store) if row["uri"] == uri), None)
    if found is None:
        return None
    events = Assets(store).events(uri, limit)
    return {**found, "latest": [{**e.doc(), "at": iso(e.created_at)} for e in events]}


def _refs(assets: Assets) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for row in assets.refs():
        found.setdefault((row["uri"], row["role"]), []).append(row["dag_id"])
    return found


def _kind(uri: str) -> str:
    return "event" if uri.startswith(EVENT_PREFIX) else "asset"
