"""Prometheus metrics of the scheduler, served on /metrics when `--metrics-port` is set.

Counts of runs and task instances by state are read from the state store when Prometheus
scrapes (a collector with its own connection, used under a lock by the HTTP threads), so an
idle scheduler does no work for them. What only the main loop sees is recorded as it
happens: event lag (the worker's timestamp to the event being applied), dispatch latency
(an upstream task's outcome to its ready children being handed to their executor: the DAG
hop), and DAG files that failed to load. `prometheus_client` is imported only when metrics
are on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from conveyor.state import store as stores
from conveyor.state.assets import Assets
from conveyor.state.callbacks import Callbacks
from conveyor.state.runs import Runs
from conveyor.state.tasks import TaskInstances

BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)


class StateCollector(Collector):
    """Runs and task instances by state, counted in the store at each scrape."""

    def __init__(self, state_url: str) -> None:
        self._url = state_url
        self._store: stores.Store | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            if self._store is None:
                self._store = stores.from_url(self._url)
            runs = Runs(self._store).count_by_state()
            tis = TaskInstances(self._store).count_by_state()
            missed = Callbacks(self._store).deadlines_missed()
            failures = Callbacks(self._store).failures()
            queued = Assets(self._store).queued_counts()
        yield _family("conveyor_scheduler_runs", "DAG runs by state", runs)
        yield _family("conveyor_scheduler_task_instances", "Task instances by state", tis)
        # counted in the store, so every scheduler (and a restarted one) says the same
        yield CounterMetricFamily("conveyor_deadline_missed", "DAG runs that had not ended "
                                  "by their deadline (runs kept in the state store)",
                                  value=float(missed))
        failed = CounterMetricFamily("conveyor_callback_failures", "Callbacks that failed "
                                     "(raised, timed out, or were refused by their executor)",
                                     labels=["kind"])
        for kind, n in sorted(failures.items()):
            failed.add_metric([kind], float(n))
        yield failed
        waiting = GaugeMetricFamily("conveyor_asset_events_queued", "Asset and named "
                                    "events waiting for a consuming DAG's condition",
                                    labels=["dag"])
        for dag_id, n in sorted(queued.items()):
            waiting.add_metric([dag_id], float(n))
        yield waiting


    def close(self) -> None:
        """Close its state store connection (opened at the first scrape)."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def _family(name: str, doc: str, counts: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["state"])
    for state, n in counts.items():
        family.add_metric([state], float(n))
    return family


class SchedulerMetrics:
    """Everything a scheduler exports on /metrics."""

    def __init__(self, state_url: str) -> None:
        self.registry = r = CollectorRegistry()
        r.register(StateCollector(state_url))
        self.event_lag = Histogram(
            "conveyor_scheduler_event_lag_seconds", "From an event's timestamp (its sender's "
            "clock) to the scheduler applying it", registry=r, buckets=BUCKETS)
        self.dispatch_latency = Histogram(
            "conveyor_scheduler_dispatch_latency_seconds", "From a task's outcome (its "
            "worker's clock) to its ready children handed to their executor", registry=r,
            buckets=BUCKETS)
        self.load_errors = Gauge("conveyor_scheduler_dag_load_errors",
                                 "DAG files (or DAGs) that failed to load at start", registry=r)

    def dispatched(self, outcome_at: float, children: int) -> None:
        """`children` were dispatched because of an outcome stamped `outcome_at`."""
        latency = time.time() - outcome_at
        for _ in range(children):
            self.dispatch_latency.observe(latency)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)
