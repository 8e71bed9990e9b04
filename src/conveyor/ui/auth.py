"""Who may change state: the operator's token, sent with a same-origin POST.

Reading needs nothing (bind the server to 127.0.0.1, the default, or put it behind your
proxy's login). Actions (retry, clear or mark a task, requeue, purge, trigger, pause, set or
clear a limit) need the token the operator set in
`ui_token` / CONVEYOR_UI_TOKEN; with none set the dashboard is read-only and says so.

CSRF: actions are POST only; the token travels in the `X-Conveyor-Token` header (the page's
script sends it from the browser's session storage, never from a cookie, so a forged
cross-site request does not carry it) or, for scripts, a `token` field of the body. A
request whose Origin is not this server, or that the browser marks cross-site
(Sec-Fetch-Site), is refused before the token is even looked at.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from conveyor.ui.http import HttpError, Request

TOKEN_HEADER = "x-conveyor-token"
READ_ONLY = ("actions are turned off: this dashboard is read-only because the operator set no "
             "token (set ui_token in conveyor.toml or CONVEYOR_UI_TOKEN, then restart "
             "`conveyor ui`)")


def check_action(request: Request, token: str) -> None:
    """Raise HttpError unless `request` may change state."""
    if not token:
        raise HttpError(403, READ_ONLY)
    check_same_origin(request)
    given = request.headers.get(TOKEN_HEADER) or str(request.form().get("token") or "")
    if not given:
        raise HttpError(401, "this action needs the operator's token: enter it in the "
                        "dashboard's token box (or send the X-Conveyor-Token header)")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HttpError(403, "wrong token: nothing was changed (check ui_token / "
                        "CONVEYOR_UI_TOKEN)")


def check_same_origin(request: Request) -> None:
    """Refuse a request another site's page made the browser send."""
    site = request.headers.get("sec-fetch-site", "")
    if site and site not in ("same-origin", "none"):
        raise HttpError(403, f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = request.headers.get("origin", "")
    host = request.headers.get("host", "")
    if origin and origin != "null" and urlsplit(origin).netloc != host:
        raise HttpError(403, f"cross-site request refused: origin {origin} is not this "
                        f"dashboard ({host})")
    if origin == "null":
        raise HttpError(403, "cross-site request refused: opaque origin")
