"""Server-rendered HTML: escaping, the page around every view, tables, state badges.

Every value that comes from data goes through `e()` (or a helper that calls it); helpers
return markup as `str`, so composing them is plain string joining. No template engine: the
pages are small and a function per fragment reads top to bottom.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from conveyor.scheduler.runs import iso

#: Bumped when app.js or app.css change, so a browser never runs an old script.
ASSET_VERSION = "8"


def e(value: Any) -> str:
    """Text for HTML (content or a quoted attribute); None is empty."""
    return "" if value is None else escape(str(value))


def url(path: str, **query: Any) -> str:
    """`path` with the query arguments that have a value, escaped for an attribute."""
    args = {k: v for k, v in query.items() if v not in (None, "")}
    return e(path + ("?" + urlencode(args) if args else ""))


def seg(value: str) -> str:
    """One path segment (an id with a slash or a space stays one segment)."""
    return quote(value, safe="")


def badge(state: str | None) -> str:
    return f'<span class="st st-{e(state)}">{e(state or "")}</span>' if state else ""


def when(ts: float | None) -> str:
    """A time for a table: UTC to the second (the JSON API has the milliseconds)."""
    return "" if ts is None else iso(ts)[:19].replace("T", " ")


def age(ts: float, now: float) -> str:
    """How long ago `ts` was, kept current in the browser (app.js updates `data-since`)."""
    return (f'<time class="age" datetime="{e(iso(ts))}" data-since="{ts:.3f}">'
            f"{e(ago(now - ts))}</time>")


def ago(elapsed: float) -> str:
    """A duration as people say it: 42 s, 5 min, 2 h 5 min, 3 d 4 h (app.js: `ago`)."""
    whole = max(0, int(elapsed))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "",
          empty: str = "nothing to show") -> str:
    """A table of markup cells (escape data before it gets here)."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    if not body:
        return f'<p class="empty">{e(empty)}</p>'
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def select(name: str, options: Sequence[str], chosen: str, *, blank: str = "any") -> str:
    items = [f'<option value=""{" selected" if not chosen else ""}>{e(blank)}</option>']
    items += [f'<option value="{e(o)}"{" selected" if o == chosen else ""}>{e(o)}</option>'
              for o in options]
    return f'<select name="{e(name)}" id="f-{e(name)}">{"".join(items)}</select>'


def action_form(path: str, label: str, *, fields: dict[str, str] | None = None,
                confirm: str = "", cls: str = "") -> str:
    """A button that POSTs to an action endpoint; app.js sends it with the token."""
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
                     for k, v in (fields or {}).items())
    ask = f' data-confirm="{e(confirm)}"' if confirm else ""
    return (f'<form class="action {e(cls)}" method="post" action="{e(path)}"{ask}>{hidden}'
            f'<button type="submit">{e(label)}</button></form>')


@dataclass(frozen=True)
class Chrome:
    """What every page shows around its content: the navigation and the server's mode."""

    nav: Sequence[tuple[str, str]]     # (label, path)
    read_only: str                     # why actions are off; '' when a token is set
    where: str                         # the state store and broker, passwords masked


def page(chrome: Chrome, title: str, body: str, *, active: str = "", poll: str = "") -> str:
    """A whole page. `poll`: the JSON endpoint app.js watches to refresh `body` live."""
    links = "".join(f'<a href="{e(path)}"{" class=on" if path == active else ""}>{e(label)}</a>'
                    for label, path in chrome.nav)
    mode = (f'<p class="banner" id="read-only">Read-only: {e(chrome.read_only)}</p>'
            if chrome.read_only else _token_box())
    live = f' data-poll="{e(poll)}"' if poll else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} · Conveyor</title>
<link rel="stylesheet" href="/static/app.css?v={ASSET_VERSION}">
<script src="/static/app.js?v={ASSET_VERSION}" defer></script>
</head><body{' class="read-only"' if chrome.read_only else ""}>
<header><a class="brand" href="/">Conveyor</a><nav>{links}</nav>
<span class="live" id="live" hidden>live</span></header>
{mode}
<p id="flash" role="status" hidden></p>
<main id="content"{live}>{body}</main>
<footer>{e(chrome.where)} · <a href="/api">JSON API</a></footer>
</body></html>"""


def _token_box() -> str:
    return ('<form id="token-form" class="token"><label>Token for actions '
            '<input type="password" id="token" autocomplete="off" '
            'placeholder="ui_token"></label><button type="submit">Use</button>'
            '<span id="token-state"></span></form>')
