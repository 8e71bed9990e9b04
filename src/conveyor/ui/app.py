"""The dashboard as a function from `Request` to `Response`: routing, the token check on
actions, errors for people, and the connections handlers share.

Nothing runs between requests: no thread polls a store or a broker while nobody has a page
open (a page that is open polls the JSON API itself, and only while it is visible). State
stores are kept in a small pool (one per concurrent request, opened on demand); brokers are
opened for the request that needs one and closed after it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from conveyor import broker as brokers
from conveyor import limits
from conveyor.errors import BrokerError, ConveyorError, StateStoreUnavailable
from conveyor.limits import Limiter
from conveyor.locations import redact
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.folder import Loaded, load_folder
from conveyor.state import store as stores
from conveyor.state.store import Store
from conveyor.ui import auth
from conveyor.ui.html import Chrome, e, page
from conveyor.ui.http import HttpError, Request, Response, Router

log = logging.getLogger("conveyor.ui")

#: The page modules, in the order their links appear in the navigation.
PAGES = (
    "conveyor.ui.pages.runs",
    "conveyor.ui.pages.tasks",
    "conveyor.ui.pages.cancel",
    "conveyor.ui.pages.dags",
    "conveyor.ui.pages.assets",
    "conveyor.ui.pages.deadletters",
    "conveyor.ui.pages.queues",
    "conveyor.ui.pages.limits",
    "conveyor.ui.pages.workers",
    "conveyor.ui.pages.autoscaler",
    "conveyor.ui.pages.api",
)
#: Idle state stores kept open for the next request.
POOL = 4
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".png": "image/png", ".svg": "image/svg+xml"}
#: Sent with every response: no framing, no sniffing, scripts and styles from here only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


@dataclass(frozen=True)
class UiConfig:
    scheduler: SchedulerConfig      # the broker, the state store, the DAGs folder
    token: str = ""                 # '' = read-only
    extra_queues: tuple[str, ...] = ()


class Dashboard:
    """Routes and shared resources; `handle` is safe to call from many threads."""

    def __init__(self, config: UiConfig) -> None:
        self.config = config
        self.router = Router()
        self.nav: list[tuple[str, str]] = []
        self._stores: queue.LifoQueue[Store] = queue.LifoQueue()
        self._dags_lock = threading.Lock()
        self._dags: tuple[tuple[Any, ...], Loaded] | None = None
        for name in PAGES:
            importlib.import_module(name).register(self)

    # -- what handlers use ----------------------------------------------------------------

    def add_nav(self, label: str, path: str) -> None:
        """A link in the navigation bar (pages call it from `register`)."""
        self.nav.append((label, path))

    @contextmanager
    def store(self) -> Iterator[Store]:
        """A state store for this request (from the pool, or newly opened)."""
        try:
            opened = self._stores.get_nowait()
        except queue.Empty:
            opened = stores.from_url(self.config.scheduler.settings.state_url)
        try:
            yield opened
        except BaseException:
            opened.close()   # its connection may be mid-transaction or broken: never reuse
            raise
        if self._stores.qsize() < POOL:
            self._stores.put(opened)
        else:
            opened.close()

    def close(self) -> None:
        """Close the pooled state stores (when the server stops, or a test ends)."""
        while True:
            try:
                self._stores.get_nowait().close()
            except queue.Empty:
                return

    @contextmanager
    def broker(self) -> Iterator[brokers.Administrator]:
        """A broker connection for this request, closed after it."""
        with brokers.from_url(self.config.scheduler.settings.broker_url) as opened:
            yield opened

    @contextmanager
    def limiter(self) -> Iterator[Limiter]:
        """Flow control's store (where the workers keep limits), opened for this request;
        503 when it cannot be reached."""
        where = self.config.scheduler.settings.stores().limits
        try:
            opened = limits.from_url(where)
            try:
                yield opened
            finally:
                opened.close()
        except _unreachable() as exc:   # the store's client (redis, psycopg) says why
            raise HttpError(503, f"cannot read flow-control limits from {redact(where)}: "
                            f"{exc}") from None

    def scheduler_queues(self) -> tuple[str, str]:
        """The queues this deployment's schedulers consume: their events and control."""
        return self.config.scheduler.events_queue, self.config.scheduler.control_queue

    def dags(self) -> Loaded:
        """The DAGs of the folder, loaded again only when a file there changed."""
        folder = Path(self.config.scheduler.dags_folder)
        with self._dags_lock:
            stamp = _stamp(folder)
            if self._dags is None or self._dags[0] != stamp:
                self._dags = stamp, load_folder(folder, self.config.scheduler.executors)
            return self._dags[1]

    def page(self, request: Request, title: str, body: str, *, active: str = "",
             poll: str = "") -> Response:
        """An HTML page; only its content when app.js asks (`?partial=1`, a live refresh)."""
        if request.arg("partial"):
            return Response.html(body)
        return Response.html(page(self.chrome(), title, body, active=active, poll=poll))

    def chrome(self) -> Chrome:
        settings = self.config.scheduler.settings
        where = (f"state {redact(settings.stores().state)} · broker "
                 f"{redact(settings.broker_url or 'embedded SQLite')}")
        return Chrome(self.nav, "" if self.config.token else auth.READ_ONLY, where)

    # -- one request ------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = self._dispatch(request)
        except HttpError as exc:
            response = self._error(request, exc.status, exc.message)
        except (StateStoreUnavailable, BrokerError) as exc:
            response = self._error(request, 503, str(exc))
        except ConveyorError as exc:
            response = self._error(request, 400, str(exc))
        except Exception as exc:   # a bug: say so in the page and the log, keep serving
            log.exception("%s %s failed", request.method, request.path)
            response = self._error(request, 500, f"the dashboard failed: {exc!r} (see its log)")
        response.headers = {**SECURITY_HEADERS, **response.headers}
        log.debug("%s %s -> %d in %.1f ms", request.method, request.path, response.status,
                  (time.perf_counter() - started) * 1000)
        return response

    def _dispatch(self, request: Request) -> Response:
        if request.method == "GET" and request.path.startswith("/static/"):
            return _static(request.path.removeprefix("/static/"))
        if request.path == "/favicon.ico":   # browsers ask; there is none (and no 404 noise)
            return Response(204, content_type="image/x-icon")
        route, params = self.router.match(request.method, request.path)
        request.params = params
        if route.action:
            auth.check_action(request, self.config.token)
        return route.handler(self, request, **params)

    def _error(self, request: Request, status: int, message: str) -> Response:
        if request.path.startswith("/api/") or request.method == "POST":
            return Response.json({"error": message}, status)
        body = f'<h1>{status}</h1><p class="error">{e(message)}</p>'
        if request.arg("partial"):
            return Response.html(body, status)
        return Response.html(page(self.chrome(), f"{status}", body), status)


def _static(name: str) -> Response:
    """A file shipped in the package's static/ folder (no other path is reachable)."""
    suffix = Path(name).suffix
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise HttpError(404, f"no static file {name!r}")
    try:
        data = resources.files("conveyor.ui").joinpath("static").joinpath(name).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise HttpError(404, f"no static file {name!r}") from None
    return Response(200, data, STATIC_TYPES[suffix],
                    {"Cache-Control": "public, max-age=86400, immutable"})


@functools.cache
def _unreachable() -> tuple[type[BaseException], ...]:
    """The errors a limits store's client raises when it cannot be reached (the limiter
    passes them on as they are)."""
    found: list[type[BaseException]] = [sqlite3.OperationalError, OSError]
    try:
        import redis
        found += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    except ImportError:
        pass
    try:
        import psycopg
        found.append(psycopg.OperationalError)
    except ImportError:
        pass
    return tuple(found)


def _stamp(folder: Path) -> tuple[Any, ...]:
    """What changes when a DAG file is added, removed or edited."""
    try:
        return tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                            for p in folder.glob("*.py")))
    except OSError:
        return ()
