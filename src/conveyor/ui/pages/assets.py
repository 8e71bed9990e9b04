"""Assets: which DAG produces and which consumes each, its latest events; recording an
asset update (`POST /api/assets/touch`) or sending a named event (`POST /api/events/{name}`)
from outside, as `conveyor assets touch` and `conveyor events send` do."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from conveyor.errors import ConfigError
from conveyor.readers.assets import asset_doc, asset_rows
from conveyor.scheduler import daemon as daemons
from conveyor.state.assets import asset_uri, event_key, record_event
from conveyor.ui.html import e, seg, table, url
from conveyor.ui.http import HttpError, Request, Response, json_object

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard


def register(ui: Dashboard) -> None:
    ui.add_nav("Assets", "/assets")
    ui.router.add("GET", "/assets", assets_page)
    ui.router.add("GET", "/api/assets", assets_api)
    ui.router.add("GET", "/api/asset", asset_api)
    ui.router.add("POST", "/api/assets/touch", touch, action=True)
    ui.router.add("POST", "/api/events/{name}", send_event, action=True)


def assets_api(ui: Dashboard, request: Request) -> Response:
    """Every asset (and named event): producing and consuming DAGs, events, last event."""
    with ui.store() as store:
        return Response.json({"assets": asset_rows(store)})


def asset_api(ui: Dashboard, request: Request) -> Response:
    """One asset (?uri=...): its producers, consumers and latest events."""
    uri = request.arg("uri")
    with ui.store() as store:
        doc = asset_doc(store, uri, request.int_arg("limit", 20, 1, 500))
    if doc is None:
        raise HttpError(404, f"no asset {uri!r}: no DAG names it and no event of it was "
                             "recorded")
    return Response.json(doc)


def assets_page(ui: Dashboard, request: Request) -> Response:
    uri = request.arg("uri")
    with ui.store() as store:
        rows = asset_rows(store)
        doc = asset_doc(store, uri) if uri else None
    body = "<h1>Assets</h1>" + table(
        ["asset", "produced by", "consumed by", "events", "queued", "last event"],
        ([f'<a href="{url("/assets", uri=r["uri"])}">{e(r["uri"])}</a>',
          _dags(r["producers"]), _dags(r["consumers"]), e(r["events"]), e(r["queued"]),
          e(r["last_event"][:19].replace("T", " "))] for r in rows),
        cls="assets", empty="no asset yet: a task's outlets=[Asset(...)] or a DAG's "
                            "schedule=Asset(...) names one")
    if doc is not None:
        body += f"<h2>Latest events of {e(uri)}</h2>" + table(
            ["event", "at", "from", "extra"],
            ([e(ev["event_id"]), e(ev["at"][:23].replace("T", " ")), _source(ev),
              f"<code>{e(json.dumps(ev['extra']))}</code>"] for ev in doc["latest"]),
            empty="no event yet")
    return ui.page(request, "Assets", body, active="/assets",
                   poll=url("/api/asset", uri=uri) if uri else "/api/assets")


def touch(ui: Dashboard, request: Request) -> Response:
    """Record an update of an asset made outside a DAG; body: {"uri": "...", "extra":
    {...}} (extra optional)."""
    form = request.form()
    try:
        uri = asset_uri(str(form.get("uri") or ""))
    except ConfigError as exc:
        raise HttpError(400, f'{exc} (body: {{"uri": "s3://lake/orders"}})') from None
    return _record(ui, uri, json_object(form.get("extra"), "extra"), None)


def send_event(ui: Dashboard, request: Request, name: str) -> Response:
    """Send a named event: each DAG scheduled on Event(name) gets a run with the payload
    as its conf; body: {"payload": {...}, "dedupe_key": "..."} (both optional)."""
    form = request.form()
    key = form.get("dedupe_key")
    return _record(ui, event_key(name), json_object(form.get("payload"), "payload"),
                   str(key) if key else None)


def _record(ui: Dashboard, uri: str, extra: dict[str, Any], dedupe_key: str | None
            ) -> Response:
    with ui.store() as store:
        event_id, new = record_event(store, uri, extra, time.time(), source="api",
                                     dedupe_key=dedupe_key)
    if new:
        daemons.poke(ui.config.scheduler, "")
    said = f"event {event_id} of {uri} recorded" if new else \
        f"{uri} with dedupe key {dedupe_key!r} was sent before (event {event_id}): no-op"
    return Response.json({"event_id": event_id, "uri": uri, "new": new, "message": said})


def _dags(ids: list[str]) -> str:
    return ", ".join(f'<a href="{url("/runs", dag=d)}">{e(d)}</a>' for d in ids) or "—"


def _source(ev: dict[str, Any]) -> str:
    if ev["run_id"]:
        return (f'<a href="/runs/{e(seg(ev["run_id"]))}">{e(ev["dag_id"])} / '
                f'{e(ev["task_id"])}</a>')
    return e(ev["source"])
