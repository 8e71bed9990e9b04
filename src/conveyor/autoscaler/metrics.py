"""What the autoscaler exposes over HTTP: Prometheus /metrics, and depth for KEDA.

* `/metrics`: depth per queue and state (as last read), current and desired replicas per
  target, scaling events, wake-ups from zero, and errors, for Prometheus.
* `/api/v1/queues/<queue>`: that queue's depth read now, as JSON with `active` = ready +
  in flight, less the ready messages a full concurrency limit blocks (`blocked`, see
  blocked.py: the same count the autoscaler scales on), for KEDA's `metrics-api` scaler
  (`valueLocation: active`); 503 with the reason if the broker cannot be read, so KEDA
  applies its fallback.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from conveyor.autoscaler.blocked import Blocked
from conveyor.broker import Depth, Inspector
from conveyor.limits import Limiter
from conveyor.locations import listening

log = logging.getLogger("conveyor.autoscaler")
QUEUE_API = "/api/v1/queues/"


class AutoscalerMetrics:
    """Every series the autoscaler exports, in one registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.depth = Gauge("conveyor_queue_depth", "Messages in a queue by state, as last "
                           "read by the autoscaler", ["queue", "state"], registry=r)
        self.replicas = Gauge("conveyor_autoscaler_replicas", "Replicas a target has",
                              ["target"], registry=r)
        self.desired = Gauge("conveyor_autoscaler_desired_replicas", "Replicas the scaling "
                             "rule wants for a target", ["target"], registry=r)
        self.scalings = Counter("conveyor_autoscaler_scaling_events", "Replica changes made, "
                                "by direction (up, down)", ["target", "direction"], registry=r)
        self.wakeups = Counter("conveyor_autoscaler_wakeups", "Targets at zero woken by new "
                               "work before their next poll", ["target"], registry=r)
        self.errors = Counter("conveyor_autoscaler_errors", "Failures by kind: depth (the "
                              "broker could not be read: fallback replicas), target (it could "
                              "not be read or scaled)", ["target", "kind"], registry=r)

    def observe_depth(self, queue: str, depth: Depth) -> None:
        for state in ("ready", "in_flight", "delayed", "dead"):
            self.depth.labels(queue, state).set(getattr(depth, state))


class MetricsServer:
    """A small threaded HTTP server for both endpoints; stop it with `close()`."""

    def __init__(self, metrics: AutoscalerMetrics, open_broker: Callable[[], Inspector],
                 port: int, addr: str = "0.0.0.0",
                 open_limiter: Callable[[], Limiter] | None = None) -> None:
        self.metrics = metrics
        self._blocked = Blocked(open_limiter)  # used under _lock, as the broker is
        self._open_broker = open_broker
        self._broker: Inspector | None = None
        self._lock = threading.Lock()
        with listening("the autoscaler's /metrics", addr, port, "--metrics-port"):
            self._server = ThreadingHTTPServer((addr, port), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="autoscaler-http", daemon=True)
        self._thread.start()

    def depth_json(self, queue: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for one queue's depth, read now through our own broker."""
        try:
            with self._lock:
                if self._broker is None:
                    self._broker = self._open_broker()
                depth = self._broker.depth(queue)
                runnable = self._blocked.ready(self._broker, queue, depth.ready)
        except Exception as exc:  # any broker failure: KEDA must see an error, not a 0
            return 503, {"queue": queue, "error": f"{type(exc).__name__}: {exc}"}
        return 200, {"queue": queue, "ready": depth.ready, "in_flight": depth.in_flight,
                     "delayed": depth.delayed, "dead": depth.dead,
                     "blocked": depth.ready - runnable, "active": runnable + depth.in_flight}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            if self._broker is not None:
                self._broker.close()
            self._blocked.close()


def _handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.metrics.registry))
            elif path.startswith(QUEUE_API) and len(path) > len(QUEUE_API):
                status, body = server.depth_json(unquote(path[len(QUEUE_API):]))
                self._send(status, "application/json", json.dumps(body).encode())
            else:
                self._send(404, "text/plain", b"try /metrics or /api/v1/queues/<queue>\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
