"""Queues over time: depth as the scheduler sampled it, and tasks finished per minute.

Depth history comes from `conveyor_queue_samples` (see `conveyor.scheduler.sampler`: one row
per queue per sampling period, kept a few hours). Throughput and failure rate come from the
attempts the state store records as the scheduler applies outcomes: they count the tasks the
scheduler runs (DAG tasks, `conveyor submit`), not messages a Client publishes straight to a
broker, which no store hears about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.broker import Broker
from conveyor.readers.queues import known_queues, queue_rows
from conveyor.state.store import Store

#: The window the dashboard charts unless asked for another, in seconds.
HOUR = 3600.0


def depth_history(store: Store, since: float) -> dict[str, list[list[float]]]:
    """Per queue, its samples since `since`, oldest first: [at, ready, in_flight, delayed,
    dead], `at` the start of the sampling period (Unix seconds)."""
    found: dict[str, list[list[float]]] = {}
    for r in store.rows("queue_samples", since=since):
        found.setdefault(r["queue"], []).append(
            [r["at"], r["ready"], r["in_flight"], r["delayed"], r["dead"]])
    return found


def finished_per_minute(store: Store, since: float) -> dict[str, list[list[float]]]:
    """Per queue, attempts that ended in each minute since `since`, oldest first: [minute,
    succeeded, failed] (failed in any way: raised, OOM-killed, timed out, dead-lettered,
    whether or not a retry follows)."""
    found: dict[str, list[list[float]]] = {}
    for r in store.rows("outcomes_per_minute", since=since):
        found.setdefault(r["queue"], []).append(
            [float(r["minute"]), int(r["succeeded"]), int(r["failed"])])
    return found


def queue_overview(store: Store, broker: Broker, extra: Sequence[str], now: float,
                   window: float = HOUR) -> dict[str, Any]:
    """Each queue's depth now (read from the broker) with its finished tasks and failure
    rate over `window`, and the history behind the charts: one JSON-ready document."""
    since = now - window
    history = depth_history(store, since)
    minutes = finished_per_minute(store, since)
    names = known_queues(store, extra)
    names += [q for q in [*history, *minutes] if q not in names]   # no longer in use
    rows = queue_rows(broker, list(dict.fromkeys(names)))
    for row in rows:
        succeeded = sum(int(m[1]) for m in minutes.get(row["queue"], []))
        failed = sum(int(m[2]) for m in minutes.get(row["queue"], []))
        finished = succeeded + failed
        row.update(succeeded=succeeded, failed=failed,
                   per_minute=round(finished * 60 / window, 2),
                   failure_rate=round(failed / finished, 3) if finished else None)
    return {"since": since, "until": now, "window": window, "queues": rows,
            "depth": history, "finished": minutes}
