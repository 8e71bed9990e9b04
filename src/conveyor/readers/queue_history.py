"""Queues over time: depth as the scheduler sampled it, and tasks finished per minute.

Both come from `conveyor_queue_samples` (see `conveyor.scheduler.sampler`: one row per queue
per sampling period, kept a few hours). Finished tasks are what registered workers reported
on their heartbeats: every task they ran, DAG tasks and messages published straight to a
broker alike; a worker started without a state store reports to none and is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.broker import Administrator
from conveyor.readers.queues import known_queues, queue_rows
from conveyor.scheduler.config import CONTROL_QUEUE
from conveyor.scheduler.engine import EVENTS_QUEUE
from conveyor.scheduler.sampler import DEFAULT_INTERVAL
from conveyor.state.monitoring import QueueSamples, Schedulers, Workers
from conveyor.state.store import Store

#: The queues a scheduler consumes unless configured otherwise: its events and control.
SCHEDULER_QUEUES = (EVENTS_QUEUE, CONTROL_QUEUE)
#: The window the dashboard charts unless asked for another, in seconds.
HOUR = 3600.0
#: Counts are trusted only while a scheduler samples: its newest sample of the queue is no
#: older than this many sampling intervals (and at least `FRESH_FLOOR` seconds).
FRESH_INTERVALS, FRESH_FLOOR = 3, 60.0


def history(store: Store, since: float) -> tuple[dict[str, list[list[float]]],
                                                 dict[str, list[list[float]]]]:
    """Per queue since `since`, oldest first: its depth samples [at, ready, in_flight,
    delayed, dead] (`at` the start of the sampling period, Unix seconds), and the tasks that
    finished in each minute [minute, succeeded, failed] (failed in any way: raised,
    OOM-killed, timed out; a retry that follows counts again)."""
    depth: dict[str, list[list[float]]] = {}
    minutes: dict[str, dict[float, list[float]]] = {}
    for r in QueueSamples(store).since(since):
        depth.setdefault(r.queue, []).append([r.at, r.ready, r.in_flight, r.delayed, r.dead])
        if r.succeeded or r.failed:
            minute = float(r.at - r.at % 60)
            row = minutes.setdefault(r.queue, {}).setdefault(minute, [minute, 0, 0])
            row[1] += r.succeeded or 0
            row[2] += r.failed or 0
    return depth, {q: list(by_minute.values()) for q, by_minute in minutes.items()}


def queue_overview(store: Store, broker: Administrator, extra: Sequence[str], now: float,
                   window: float = HOUR, scheduler_queues: Sequence[str] = SCHEDULER_QUEUES
                   ) -> dict[str, Any]:
    """Each queue's depth now (read from the broker) with its finished tasks and failure
    rate over `window`, and the history behind the charts: one JSON-ready document."""
    since = now - window
    depth, minutes = history(store, since)
    names = known_queues(store, extra)
    names += [q for q in depth if q not in names]   # sampled, no longer in use
    rows = queue_rows(broker, list(dict.fromkeys(names)))
    fresh = now - max(FRESH_FLOOR, FRESH_INTERVALS * interval_of(depth))
    listening = consumers(store, now, scheduler_queues)
    for row in rows:
        samples = depth.get(row["queue"], [])
        row.update(consumers=listening.get(row["queue"], []),
                   sampled=bool(samples) and samples[-1][0] >= fresh,
                   last_sampled=samples[-1][0] if samples else None)
        if not row["sampled"]:   # unknown is not zero: say so instead of a wrong 0 %
            row.update(succeeded=None, failed=None, per_minute=None, failure_rate=None)
            continue
        succeeded = sum(int(m[1]) for m in minutes.get(row["queue"], []))
        failed = sum(int(m[2]) for m in minutes.get(row["queue"], []))
        finished = succeeded + failed
        row.update(succeeded=succeeded, failed=failed,
                   per_minute=round(finished * 60 / window, 2),
                   failure_rate=round(failed / finished, 3) if finished else None)
    return {"since": since, "until": now, "window": window, "queues": rows,
            "depth": depth, "finished": minutes}


def interval_of(depth: dict[str, list[list[float]]]) -> float:
    """The sampling interval, from the spacing of the samples (the default if too few)."""
    stamps = sorted({s[0] for samples in depth.values() for s in samples})
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return min(gaps) if gaps else DEFAULT_INTERVAL


def consumers(store: Store, now: float, scheduler_queues: Sequence[str] = SCHEDULER_QUEUES
              ) -> dict[str, list[dict[str, Any]]]:
    """Per queue, what consumes it now: the live registered workers (stale ones left out: a
    worker that stopped beating consumes nothing) and, on `scheduler_queues` (its events and
    control queues), the schedulers whose lease holds."""
    found: dict[str, list[dict[str, Any]]] = {}
    for w in Workers(store).all():
        if w.stale(now):
            continue
        for queue in filter(None, w.queues.split(",")):
            found.setdefault(queue, []).append(
                {"kind": "worker", "worker": w.worker_id, "host": w.hostname, "pid": w.pid,
                 "concurrency": w.concurrency, "busy": w.busy})
    for s in live_schedulers(store, now):
        for queue in scheduler_queues:
            found.setdefault(queue, []).append(
                {"kind": "scheduler", "scheduler": s["scheduler_id"], "host": s["hostname"],
                 "pid": s["pid"]})
    return found


def live_schedulers(store: Store, now: float) -> list[dict[str, Any]]:
    """The schedulers whose lease holds (each renews it while it runs: see
    conveyor.scheduler.lease)."""
    return [s.doc() for s in Schedulers(store).all() if s.lease_until >= now]
