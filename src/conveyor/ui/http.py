"""Requests, responses and the router: the little HTTP the dashboard needs, no framework.

A route is a method and a path pattern (`/runs/{run_id}`: each `{name}` matches one path
segment and is passed to the handler by name). Handlers take the `Request` and return a
`Response`; an `HttpError` raised anywhere becomes an error response with its message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

#: Largest request body read (a form or a JSON document of ids): nothing here needs more.
MAX_BODY = 1024 * 1024


class HttpError(Exception):
    """A request the dashboard refuses: `status` and a message for people."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)   # lower-cased names
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)    # from the route's {names}

    def arg(self, name: str, default: str = "") -> str:
        """A query-string value, stripped ('' or `default` when absent)."""
        return self.query.get(name, default).strip()

    def int_arg(self, name: str, default: int, low: int, high: int) -> int:
        """A whole number from the query string, or a 400 naming the argument."""
        raw = self.arg(name)
        if not raw:
            return default
        if not raw.isdigit() or not low <= int(raw) <= high:
            raise HttpError(400, f"{name}={raw!r}: give a whole number from {low} to {high}")
        return int(raw)

    def form(self) -> dict[str, Any]:
        """The body as a dict: a JSON object, or an HTML form (one value per name)."""
        kind = self.headers.get("content-type", "").split(";")[0].strip()
        if not self.body:
            return {}
        if kind == "application/json":
            try:
                doc = json.loads(self.body)
            except (UnicodeDecodeError, ValueError):
                raise HttpError(400, "the body is not JSON") from None
            if not isinstance(doc, dict):
                raise HttpError(400, "the body must be a JSON object")
            return doc
        if kind == "application/x-www-form-urlencoded":
            pairs = parse_qs(self.body.decode("utf-8", "replace"), keep_blank_values=True)
            return {k: v[-1] for k, v in pairs.items()}
        raise HttpError(415, "send application/json or an HTML form")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def html(cls, text: str, status: int = 200) -> Response:
        return cls(status, text.encode())

    @classmethod
    def json(cls, doc: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(doc, default=str).encode(), "application/json")


Handler = Callable[..., Response]


def json_object(raw: Any, name: str) -> dict[str, Any]:
    """A body's field that holds a JSON object: given as one, as its text (an HTML form's
    field), or absent ({})."""
    if raw in (None, ""):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise HttpError(400, f"{name} {raw!r} is not JSON: give an object, e.g. "
                            '{"day": "2026-11-23"}') from None
    if not isinstance(raw, dict):
        raise HttpError(400, f"{name} must be a JSON object")
    return raw


@dataclass
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    action: bool   # changes state: needs the operator's token


class Router:
    """Routes, matched in the order they were added."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, path: str, handler: Handler, *, action: bool = False) -> None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
        self.routes.append(Route(method, re.compile(f"^{regex}$"), handler, action))

    def get(self, path: str) -> Callable[[Handler], Handler]:
        """Decorator: a page or a JSON endpoint that only reads."""
        return self._decorator("GET", path, action=False)

    def post(self, path: str) -> Callable[[Handler], Handler]:
        """Decorator: an action (it changes state, so it needs the token)."""
        return self._decorator("POST", path, action=True)

    def _decorator(self, method: str, path: str, *, action: bool) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.add(method, path, handler, action=action)
            return handler
        return register

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route in self.routes:
            found = route.pattern.match(path)
            if found is None:
                continue
            if route.method == method:
                return route, {k: unquote(v) for k, v in found.groupdict().items()}
            allowed.append(route.method)
        if allowed:
            raise HttpError(405, f"{path} takes {', '.join(sorted(set(allowed)))}, not {method}")
        raise HttpError(404, f"nothing at {path}")
