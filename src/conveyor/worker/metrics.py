"""Prometheus metrics, fed by lifecycle events in one place.

The supervisor does not sprinkle counters: it hands the kind of every lifecycle event it
emits to `record` (the kind alone: a task nobody listens to gets no `Event` built), and
reports the state that is not an event through `runner_wait` and `load`.
A worker without a metrics port gets `Metrics`, which records nothing: nobody could scrape
it, and prometheus_client (with its HTTP server) is then never imported, which keeps it out
of the supervisor's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OUTCOMES = ("succeeded", "failed", "oom_killed", "timed_out", "dead_lettered", "retried",
            "interrupted", "expired", "cancelled", "skipped", "deferred")


class Metrics:
    """What the supervisor tells its metrics; this base records nothing (no /metrics port)."""

    #: Whether flow-control usage (read from the limiter's store) is worth reading for it.
    wants_limits = False

    def record(self, kind: str, queue: str, duration: float | None = None) -> None:
        """A lifecycle event (`Event.kind`) of a task on `queue` (and its run time, once it
        ended)."""

    def runner_wait(self, seconds: float) -> None:
        """How long an accepted delivery waited for its runner to start."""

    def load(self, in_flight: int, free_slots: int) -> None:
        """Deliveries held and runner slots free, after any change."""

    def limit_denied(self, key: str, verdict: str) -> None:
        """A limited message could not start: its key was full ("parked") or its rate
        had no token ("delayed")."""

    def limits(self, usage: Sequence[Any]) -> None:
        """Every key's tokens in use and messages waiting, fleet-wide (`limits.Usage`)."""

    def follow_up(self, queue: str, outcome: str) -> None:
        """A message a task enqueued through this worker, for `queue`: "published",
        "refused" (not a valid message) or "failed" (the broker did not take it). Called
        from the publishing thread (worker/followups.py)."""


def metrics_for(port: int) -> Metrics:
    """Prometheus metrics when they can be served on `port`, else the silent base."""
    return WorkerMetrics() if port else Metrics()


class WorkerMetrics(Metrics):
    """Everything a worker exports on /metrics."""

    wants_limits = True

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.tasks = Counter("conveyor_tasks", "Task outcomes by kind and queue",
                             ["outcome", "queue"], registry=r)
        self.started = Counter("conveyor_tasks_started", "Tasks started", ["queue"], registry=r)
        self.duration = Histogram("conveyor_task_duration_seconds", "Run time of finished tasks",
                                  ["queue"], registry=r,
                                  buckets=(.005, .01, .05, .1, .5, 1, 5, 30, 120, 600, 3600))
        self.fork_latency = Histogram(
            "conveyor_runner_wait_seconds", "From accepting a delivery to its runner starting",
            registry=r, buckets=(.0005, .001, .002, .005, .01, .05, .1, .5, 1))
        self.in_flight = Gauge("conveyor_in_flight", "Deliveries held by this worker",
                               registry=r)
        self.free_slots = Gauge("conveyor_free_slots", "Runner slots free", registry=r)
        self.oom_kills = Counter("conveyor_oom_kills", "Tasks killed over their memory cap",
                                 ["queue"], registry=r)
        self.dead_letters = Counter("conveyor_dead_letters", "Messages dead-lettered",
                                    ["queue"], registry=r)
        self.limit_in_use = Gauge("conveyor_limit_in_use", "Flow-control tokens in use per "
                                  "key, fleet-wide", ["key"], registry=r)
        self.limit_waiting = Gauge("conveyor_limit_waiting", "Messages parked until their "
                                   "key has room, fleet-wide", ["key"], registry=r)
        self._limit_keys: set[str] = set()
        self.limit_denials = Counter("conveyor_limit_denied", "Limited messages this worker "
                                     "could not start: parked (key full) or delayed (rate)",
                                     ["key", "verdict"], registry=r)
        self.follow_ups = Counter("conveyor_follow_ups", "Messages tasks enqueued through "
                                  "this worker: published, refused or failed",
                                  ["queue", "outcome"], registry=r)

    def record(self, kind: str, queue: str, duration: float | None = None) -> None:
        if kind == "started":
            self.started.labels(queue).inc()
        elif kind in OUTCOMES:
            self.tasks.labels(kind, queue).inc()
        if kind == "oom_killed":
            self.oom_kills.labels(queue).inc()
        if kind == "dead_lettered":
            self.dead_letters.labels(queue).inc()
        if duration is not None:
            self.duration.labels(queue).observe(duration)

    def runner_wait(self, seconds: float) -> None:
        self.fork_latency.observe(seconds)

    def load(self, in_flight: int, free_slots: int) -> None:
        self.in_flight.set(in_flight)
        self.free_slots.set(free_slots)

    def limit_denied(self, key: str, verdict: str) -> None:
        self.limit_denials.labels(key, verdict).inc()

    def follow_up(self, queue: str, outcome: str) -> None:
        self.follow_ups.labels(queue, outcome).inc()

    def limits(self, usage: Sequence[Any]) -> None:
        """A key the store forgot (idle: `limits.base`) loses its series, which would
        otherwise show its last figures, one per tenant, forever."""
        keys = {u.key for u in usage}
        for gone in self._limit_keys - keys:
            self.limit_in_use.remove(gone)
            self.limit_waiting.remove(gone)
        self._limit_keys = keys
        for u in usage:
            self.limit_in_use.labels(u.key).set(u.in_use)
            self.limit_waiting.labels(u.key).set(u.waiting)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread (the supervisor never forks)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=self.registry)
