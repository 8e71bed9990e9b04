"""Priority bands: where a transport without per-message priorities keeps them.

RabbitMQ's quorum queues and the kombu bridge order priorities in four bands rather than by
each value; SQLite, Postgres and Redis order by the exact value. One mapping for all of them:

| band | message priority |
|---|---|
| 0 | 0 (the default) and below |
| 1 | 1-3 |
| 2 | 4-6 |
| 3 | 7 and above (Celery's 0-9 and AMQP's 0-255 alike) |

Within a band, FIFO. The exact priority travels with the message in a header
(`x-conveyor-priority`), so a retry, a delay or a dead letter moved back keeps it, and a
delivery reports it.
"""

from __future__ import annotations

from typing import Any

#: Bands 0..TOP_BAND; `band_of` says which priorities fall in each.
TOP_BAND = 3
#: The header carrying a message's exact priority (absent: 0).
PRIORITY_HEADER = "x-conveyor-priority"


def band_of(priority: int) -> int:
    """The band of a message priority: 0 for <= 0, then 1-3, 4-6, and 7 or more."""
    if priority <= 0:
        return 0
    return min(TOP_BAND, (priority + 2) // 3)


def priority_headers(priority: int) -> dict[str, Any]:
    """Headers that carry `priority` (none for the default)."""
    return {PRIORITY_HEADER: priority} if priority else {}


def priority_of(headers: dict[str, Any] | None) -> int:
    """A message's priority from its headers (0 when absent or unreadable)."""
    try:
        return int((headers or {}).get(PRIORITY_HEADER) or 0)
    except (TypeError, ValueError):
        return 0
