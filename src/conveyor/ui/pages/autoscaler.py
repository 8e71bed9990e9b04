"""Autoscaler: each target's replicas now and desired, its bounds, the load it saw and why
it chose what it did; then its recent replica changes, each with its reason."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conveyor.readers.autoscaler import DECISIONS, scaling
from conveyor.ui.html import badge, e, seconds, table
from conveyor.ui.http import Request, Response

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard


def register(ui: Dashboard) -> None:
    ui.add_nav("Autoscaler", "/autoscaler")
    ui.router.add("GET", "/autoscaler", autoscaler_page)
    ui.router.add("GET", "/api/autoscaler", autoscaler_api)


def read(ui: Dashboard, request: Request) -> dict[str, Any]:
    limit = request.int_arg("limit", DECISIONS, 1, 1000)
    with ui.store() as store:
        return scaling(store, time.time(), limit)


def autoscaler_api(ui: Dashboard, request: Request) -> Response:
    """Each target's replicas, desired replicas, bounds, load, reason and error as last
    evaluated (`stale` when its autoscaler stopped reporting), and the newest replica
    changes with their reasons (`limit`, default 50)."""
    return Response.json(read(ui, request))


def autoscaler_page(ui: Dashboard, request: Request) -> Response:
    doc = read(ui, request)
    targets = table(
        ["target", "kind", "queues", "replicas", "desired", "min–max", "load", "why",
         "reported", "state"], (_target(t) for t in doc["targets"]), cls="targets",
        empty="no autoscaler has reported to this state store: `conveyor up` does, and "
              "`conveyor autoscaler` with --state (CONVEYOR_STATE_URL)")
    decisions = table(
        ["when", "target", "change", "why"],
        ([f'<time datetime="{e(d["at"])}">{e(d["at"][:19].replace("T", " "))}</time>',
          e(d["target"]), f'{e(d["from"])} → {e(d["to"])}', e(d["reason"])]
         for d in doc["decisions"]), cls="decisions", empty="no replica change recorded")
    note = ('<p class="count">As each target was last evaluated: the autoscaler reports when '
            "something changes, and at least once a minute (stale: it stopped reporting)."
            "</p>" if doc["targets"] else "")
    body = (f"<h1>Autoscaler</h1>{targets}{note}<h2>Recent scaling decisions</h2>"
            f"{decisions}")
    return ui.page(request, "Autoscaler", body, active="/autoscaler",
                   poll="/api/autoscaler")


def _target(t: dict[str, Any]) -> list[str]:
    load = ("unreadable" if t["ready"] is None else
            f'{t["ready"]} ready + {t["in_flight"]} in flight')
    if t["stale"]:
        state = badge("stale")
    elif t["error"]:
        state = badge("failed") + f' <span class="error">{e(t["error"])}</span>'
    else:
        state = badge("ok")
    return [e(t["target"]), e(t["kind"]), e(t["queues"].replace(",", ", ")),
            _count(t["replicas"]), _count(t["desired"]),
            f'{e(t["min_replicas"])}–{e(t["max_replicas"])}', e(load), e(t["reason"]),
            f'<span title="{e(t["evaluated"])}">{e(seconds(t["seconds_ago"]))} ago</span>',
            state]


def _count(value: int | None) -> str:
    return '<span class="empty">?</span>' if value is None else f"<b>{e(value)}</b>"
