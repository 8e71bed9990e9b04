"""Registered workers, from the registry each keeps fresh in the state store."""

from __future__ import annotations

from typing import Any

from conveyor.scheduler.runs import iso
from conveyor.state.monitoring import Workers
from conveyor.state.store import Store


def worker_rows(store: Store, now: float) -> list[dict[str, Any]]:
    """One row per worker; `stale` when its last heartbeat is older than three intervals.
    `runners`: what each runner slot held at that heartbeat (see `WorkerRecord.runners`:
    its task, for how long, and the bytes charged to it now against its cap), or None.
    `code_version`: what it announces (`--code-version`; '' from an older worker)."""
    return [{"worker": w.worker_id, "host": w.hostname, "pid": w.pid, "queues": w.queues,
             "concurrency": w.concurrency, "busy": w.busy, "free": w.free,
             "started": iso(w.started_at), "last_heartbeat": iso(w.heartbeat_at),
             "seconds_ago": round(now - w.heartbeat_at, 1), "stale": w.stale(now),
             "runners": w.runners, "code_version": w.code_version or ""}
            for w in Workers(store).all()]
