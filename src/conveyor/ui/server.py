"""The HTTP server: the standard library's ThreadingHTTPServer in front of `Dashboard.handle`.

A thread per request, none in between: a dashboard nobody looks at costs a blocked
`select()`. No dependency to keep up to date, and it serves the few operators a dashboard
has; put a reverse proxy in front for TLS and a login.
"""

from __future__ import annotations

import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from conveyor.ui.app import Dashboard
from conveyor.ui.http import MAX_BODY, Request, Response

log = logging.getLogger("conveyor.ui")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, dashboard: Dashboard, host: str, port: int) -> None:
        self.dashboard = dashboard
        super().__init__((host, port), Handler)

    @property
    def address(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def start(self) -> threading.Thread:
        """Serve from a thread of its own (for `conveyor up` and tests); `stop()` ends it."""
        thread = threading.Thread(target=self.serve_forever, name="conveyor-ui", daemon=True)
        thread.start()
        return thread

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that navigates away mid-response is no error worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("client %s went away", client_address)
            return
        super().handle_error(request, client_address)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "conveyor-ui"

    def do_GET(self) -> None:
        self._serve(b"")

    def do_HEAD(self) -> None:
        self._serve(b"", head=True)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(Response.json({"error": f"body over {MAX_BODY} bytes"}, 413))
            return
        self._serve(self.rfile.read(length))

    def _serve(self, body: bytes, head: bool = False) -> None:
        parts = urlsplit(self.path)
        request = Request(method="GET" if head else self.command, path=parts.path or "/",
                          query=dict(parse_qsl(parts.query)),
                          headers={k.lower(): v for k, v in self.headers.items()}, body=body)
        self._send(self.server.dashboard.handle(request), head)

    def _send(self, response: Response, head: bool = False) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def serve(dashboard: Dashboard, host: str, port: int) -> Server:
    """A bound server (port 0: any free one); call `serve_forever()` or `start()`."""
    return Server(dashboard, host, port)
