"""Prometheus metrics, fed by lifecycle events in one place.

The supervisor does not sprinkle counters: it hands every `Event` it emits to
`WorkerMetrics.record`, and sets the two gauges that are state rather than events.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from conveyor.events import Event

OUTCOMES = ("succeeded", "failed", "oom_killed", "timed_out", "dead_lettered", "retried",
            "interrupted")


class WorkerMetrics:
    """Everything a worker exports on /metrics."""

    def __init__(self) -> None:
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

    def record(self, event: Event, queue: str, duration: float | None = None) -> None:
        if event.kind == "started":
            self.started.labels(queue).inc()
        elif event.kind in OUTCOMES:
            self.tasks.labels(event.kind, queue).inc()
        if event.kind == "oom_killed":
            self.oom_kills.labels(queue).inc()
        if event.kind == "dead_lettered":
            self.dead_letters.labels(queue).inc()
        if duration is not None:
            self.duration.labels(queue).observe(duration)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread (the supervisor never forks)."""
        start_http_server(port, addr=addr, registry=self.registry)
