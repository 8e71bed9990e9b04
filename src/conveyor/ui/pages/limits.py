"""Limits: flow control's keys (their limit, tokens in use, messages waiting, denials, rate,
who holds the tokens), and set or clear a run-time limit: the operations of `conveyor limits
set|clear` (Limiter.set_limit / clear, checked by Override.checked), for every worker at
once from its next claim."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conveyor.limits import Override
from conveyor.readers.limits import limit_rows
from conveyor.readers.workers import worker_rows
from conveyor.ui.html import action_form, e, seconds, table
from conveyor.ui.http import HttpError, Request, Response

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard


def register(ui: Dashboard) -> None:
    ui.add_nav("Limits", "/limits")
    ui.router.add("GET", "/limits", limits_page)
    ui.router.add("GET", "/api/limits", limits_api)
    ui.router.add("POST", "/api/limits/set", set_limit, action=True)
    ui.router.add("POST", "/api/limits/clear", clear_limit, action=True)


def read(ui: Dashboard) -> list[dict[str, Any]]:
    with ui.limiter() as limiter:
        usage = limiter.usage(time.time())
    with ui.store() as store:
        workers = worker_rows(store, time.time())
    return limit_rows(usage, workers)


def limits_api(ui: Dashboard, request: Request) -> Response:
    """Every flow-control key: its limit in force (`overridden`: set at run time), tokens
    `in_use`, messages `waiting`, `denied` count, `full`, and its `holders` (message ids,
    with the worker slot and task that runs each when a registered worker reports it)."""
    return Response.json({"limits": read(ui)})


def limits_page(ui: Dashboard, request: Request) -> Response:
    rows = read(ui)
    body = ("<h1>Limits</h1>"
            + table(["key", "limit", "in use", "waiting", "denied", "held by", ""],
                    (_row(r) for r in rows), cls="limits",
                    empty="no limit yet: keys appear when a limited task is first claimed, "
                          "or when one is set here or with `conveyor limits set`")
            + '<p class="count">A key\'s limit is the one set here (or with <code>conveyor '
            "limits set</code>) if any, else the one its tasks declare. Waiting: messages "
            "parked until the key has room (they hold no worker slot). Denied: how often a "
            "message was parked or delayed by a rate.</p>"
            + "<h2>Set a limit</h2>" + _set_form("", new=True))
    return ui.page(request, "Limits", body, active="/limits", poll="/api/limits")


def _row(r: dict[str, Any]) -> list[str]:
    used = (f'{e(r["in_use"])} of {e(r["max"])}' if r["max"] is not None
            else e(r["in_use"]))
    clear = (action_form("/api/limits/clear", "Clear", fields={"key": r["key"]},
                         confirm=f"Drop the run-time limit of {r['key']}? The limit its "
                                 "tasks declare applies again.")
             if r["overridden"] else "")
    return [f'<code>{e(r["key"])}</code>',
            e(r["limit"]) + (' <span class="st st-set">set</span>' if r["overridden"] else ""),
            f'<span class="warn">{used}</span>' if r["full"] else used,
            f'<span class="warn">{e(r["waiting"])}</span>' if r["waiting"] else "0",
            e(r["denied"]), _holders(r["holders"]), _set_form(r["key"]) + " " + clear]


def _holders(holders: list[dict[str, Any]]) -> str:
    if not holders:
        return '<span class="empty">nobody</span>'
    items = "".join(
        f'<li><b>{e(h["task"])}</b> on {e(h["host"])}:{e(h["pid"])} slot {e(h["slot"])} · '
        f'{e(seconds(h.get("seconds")))} <span class="empty">{e(h["id"])}</span></li>'
        if h.get("host") else
        f'<li><code>{e(h["id"])}</code> <span class="empty">(no registered worker reports '
        "it)</span></li>" for h in holders)
    return f'<ul class="holders">{items}</ul>'


def _set_form(key: str, *, new: bool = False) -> str:
    """Max, rate and burst fields and a Set button (for a new key: its name too)."""
    name = ('<label>key <input name="key" size="18" placeholder="tenant:acme" required>'
            "</label> " if new else f'<input type="hidden" name="key" value="{e(key)}">')
    return (f'<form class="action limit" method="post" action="/api/limits/set">{name}'
            '<input name="max" size="3" inputmode="numeric" placeholder="max" '
            'aria-label="max at once"> <input name="per_second" size="4" inputmode="decimal" '
            'placeholder="/s" aria-label="starts per second"> <input name="burst" size="3" '
            'inputmode="numeric" placeholder="burst" aria-label="burst"> '
            '<button type="submit">Set</button></form>')


def set_limit(ui: Dashboard, request: Request) -> Response:
    """Override a key's limit at run time; body: {"key", "max", "per_second", "burst"}
    (any of the three; `conveyor limits set`)."""
    doc = request.form()
    key = _key(doc)
    override = Override(_number(doc, "max", int), _number(doc, "per_second", float),
                        _number(doc, "burst", int)).checked(key)
    with ui.limiter() as limiter:
        limiter.set_limit(key, override)
    return Response.json({"key": key, "max": override.max, "per_second": override.per_second,
                          "burst": override.burst,
                          "message": f"{key}: {override.describe()} (every worker, from its "
                                     "next claim)"})


def clear_limit(ui: Dashboard, request: Request) -> Response:
    """Drop a key's run-time limit: the one its tasks declare applies again; body: {"key"}
    (`conveyor limits clear`)."""
    key = _key(request.form())
    with ui.limiter() as limiter:
        had = limiter.clear(key)
    return Response.json({"key": key, "cleared": had,
                          "message": f"{key}: run-time limit cleared" if had else
                                     f"{key}: had no run-time limit"})


def _key(doc: dict[str, Any]) -> str:
    key = str(doc.get("key") or "").strip()
    if not key:
        raise HttpError(400, "say which key: key (e.g. tenant:acme, pool:exports); nothing "
                        "was changed")
    return key


def _number(doc: dict[str, Any], name: str, kind: type[int] | type[float]) -> Any:
    raw = doc.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        return kind(str(raw).strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise HttpError(400, f"{name}={raw!r}: give {what} (nothing was changed)") from None
