"""The autoscaler as it last reported: each target's replicas, desired replicas, load and
reason, and its recent replica changes with their reasons (see `conveyor.autoscaler.journal`,
which writes them to the state store)."""

from __future__ import annotations

from typing import Any

from conveyor.autoscaler.journal import KEEPALIVE
from conveyor.scheduler.runs import iso
from conveyor.state.monitoring import Scalers
from conveyor.state.store import Store

#: Replica changes shown unless asked for more.
DECISIONS = 50


def stale_after(polling_interval: float) -> float:
    """Seconds without a write after which a target's row is old news: its autoscaler
    writes at least once per keepalive, and evaluates every polling interval."""
    return KEEPALIVE + 3 * polling_interval


def scaling(store: Store, now: float, limit: int = DECISIONS) -> dict[str, Any]:
    """Targets (`stale` when their autoscaler stopped writing) and the newest changes."""
    targets = []
    scalers = Scalers(store)
    for r in scalers.all():
        age = now - r.evaluated_at
        targets.append({
            "target": r.target, "kind": r.kind, "queues": r.queues,
            "replicas": r.replicas, "desired": r.desired,
            "min_replicas": r.min_replicas, "max_replicas": r.max_replicas,
            "ready": r.ready, "in_flight": r.in_flight, "reason": r.reason,
            "error": r.error, "polling_interval": r.polling_interval,
            "evaluated": iso(r.evaluated_at), "seconds_ago": round(age, 1),
            "stale": age > stale_after(r.polling_interval)})
    decisions = [{"at": iso(r.at), "target": r.target, "from": r.from_replicas,
                  "to": r.to_replicas, "reason": r.reason}
                 for r in scalers.recent_scalings(limit)]
    return {"targets": targets, "decisions": decisions}
