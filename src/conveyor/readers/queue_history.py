"""Queues over time: depth as the scheduler sampled it, and tasks finished per minute.

Both come from `conveyor_queue_samples` (see `conveyor.scheduler.sampler`: one row per queue
per sampling period, kept a few hours). Finished tasks are what registered workers reported
on their heartbeats: every task they ran, DAG tasks and messages published straight to a
broker alike; a worker started without a state store reports to none and is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.broker import Broker
from conveyor.readers.queues import known_queues, queue_rows
from conveyor.state.store import Store

#: The window the dashboard charts unless asked for another, in seconds.
HOUR = 3600.0


def history(store: Store, since: float) -> tuple[dict[str, list[list[float]]],
                                                 dict[str, list[list[float]]]]:
    """Per queue since `since`, oldest first: its depth samples [at, ready, in_flight,
    delayed, dead] (`at` the start of the sampling period, Unix seconds), and the tasks that
    finished in each minute [minute, succeeded, failed] (failed in any way: raised,
    OOM-killed, timed out; a retry that follows counts again)."""
    depth: dict[str, list[list[float]]] = {}
    minutes: dict[str, dict[float, list[float]]] = {}
    for r in store.rows("queue_samples", since=since):
        queue = r["queue"]
        depth.setdefault(queue, []).append(
            [r["at"], r["ready"], r["in_flight"], r["delayed"], r["dead"]])
        if r["succeeded"] or r["failed"]:
            minute = float(r["at"] - r["at"] % 60)
            row = minutes.setdefault(queue, {}).setdefault(minute, [minute, 0, 0])
            row[1] += r["succeeded"] or 0
            row[2] += r["failed"] or 0
    return depth, {q: list(by_minute.values()) for q, by_minute in minutes.items()}


def queue_overview(store: Store, broker: Broker, extra: Sequence[str], now: float,
                   window: float = HOUR) -> dict[str, Any]:
    """Each queue's depth now (read from the broker) with its finished tasks and failure
    rate over `window`, and the history behind the charts: one JSON-ready document."""
    since = now - window
    depth, minutes = history(store, since)
    names = known_queues(store, extra)
    names += [q for q in depth if q not in names]   # sampled, no longer in use
    rows = queue_rows(broker, list(dict.fromkeys(names)))
    for row in rows:
        succeeded = sum(int(m[1]) for m in minutes.get(row["queue"], []))
        failed = sum(int(m[2]) for m in minutes.get(row["queue"], []))
        finished = succeeded + failed
        row.update(succeeded=succeeded, failed=failed,
                   per_minute=round(finished * 60 / window, 2),
                   failure_rate=round(failed / finished, 3) if finished else None)
    return {"since": since, "until": now, "window": window, "queues": rows,
            "depth": depth, "finished": minutes}
