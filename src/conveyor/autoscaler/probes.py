"""What the autoscaler reads: queue depth through the broker seam, and how busy a worker is.

Depth is the broker's own count (ready + in flight, due delayed messages counting as
ready), the same for every transport. Busy/idle is each worker's `conveyor_in_flight`
gauge on its /metrics: deliveries it holds, running or about to run. A worker that cannot
be asked is reported as unknown (None), never as idle.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from conveyor.autoscaler.policy import Load
from conveyor.broker import Depth, Inspector

IN_FLIGHT = "conveyor_in_flight"
#: Removal costs: idle workers go first, busy ones last, those that cannot be asked between.
IDLE_COST, UNKNOWN_COST, BUSY_COST = -1000, 0, 1000


def read_depths(broker: Inspector, queues: Sequence[str]) -> dict[str, Depth]:
    """Each queue's depth; any error propagates: the caller treats it as unreadable."""
    return {queue: broker.depth(queue) for queue in queues}


def total(depths: dict[str, Depth]) -> Load:
    """One target's load: its queues summed."""
    return Load(ready=sum(d.ready for d in depths.values()),
                in_flight=sum(d.in_flight for d in depths.values()))


def worker_in_flight(url: str, timeout: float = 1.0) -> int | None:
    """Deliveries the worker serving /metrics at `url` holds; None if it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    return parse_in_flight(text)


def parse_in_flight(text: str) -> int | None:
    """The `conveyor_in_flight` gauge of a Prometheus text exposition, if present."""
    try:
        for family in text_string_to_metric_families(text):
            if family.name == IN_FLIGHT and family.samples:
                return int(family.samples[0].value)
    except ValueError:
        return None
    return None


def deletion_cost(in_flight: int | None) -> int:
    """How much removing a worker holding `in_flight` deliveries costs (None: unknown)."""
    if in_flight is None:
        return UNKNOWN_COST
    return IDLE_COST if in_flight == 0 else BUSY_COST + min(in_flight, 1000)
