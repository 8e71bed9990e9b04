"""`/api`: the JSON API's own index, read from the router (so it never goes stale)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.ui.http import Request, Response

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard


def register(ui: Dashboard) -> None:
    ui.router.add("GET", "/api", index)


def index(ui: Dashboard, request: Request) -> Response:
    routes = [{"method": r.method, "path": _path(r.pattern.pattern),
               "needs_token": r.action, "about": (r.handler.__doc__ or "").strip()}
              for r in ui.router.routes if _path(r.pattern.pattern).startswith("/api/")]
    return Response.json({"endpoints": routes, "read_only": not ui.config.token,
                          "token_header": "X-Conveyor-Token"})


def _path(regex: str) -> str:
    """`^/runs/(?P<run_id>[^/]+)$` -> `/runs/{run_id}`."""
    return regex.strip("^$").replace("(?P<", "{").replace(">[^/]+)", "}").replace("\\", "")
