"""Message properties and headers: the delivery count, dead-letter reasons, reading back.

**Delivery count.** Quorum queues count returns in `x-delivery-count`; a copy published by
`retry_later` starts a new broker count, so the copy carries the deliveries so far in
`x-conveyor-deliveries`. `delivery_count = x-conveyor-deliveries + x-delivery-count + 1`.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pika
from pika.spec import Basic, BasicProperties

from conveyor.broker.base import DeadLetter

DELIVERIES_HEADER = "x-conveyor-deliveries"
REASON_HEADER = "x-conveyor-reason"
DEAD_AT_HEADER = "x-conveyor-dead-at"
#: Headers travel in one frame (128 KiB by default): longer reasons are cut.
MAX_REASON_BYTES = 16 * 1024


def header_int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def header_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def delivery_count(headers: dict[str, Any]) -> int:
    """Deliveries carried by earlier copies + RabbitMQ's returns of this copy + this one."""
    return (header_int(headers.get(DELIVERIES_HEADER))
            + header_int(headers.get("x-delivery-count")) + 1)


def clip_reason(reason: str) -> str:
    data = reason.encode()
    if len(data) <= MAX_REASON_BYTES:
        return reason
    return data[:MAX_REASON_BYTES].decode("utf-8", "ignore") + " …(truncated)"


def properties(message_id: str | None, headers: dict[str, Any] | None) -> BasicProperties:
    return BasicProperties(delivery_mode=pika.DeliveryMode.Persistent,
                           message_id=message_id or uuid.uuid4().hex, headers=headers or None)


def parse_version(raw: Any) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", header_text(raw))[:3]
    return tuple(int(n) for n in numbers)


def dead_id(props: BasicProperties, body: bytes) -> str:
    """A stable id for a dead letter: its message id (Conveyor always sets one)."""
    if props.message_id:
        return str(props.message_id)
    return hashlib.sha256(body).hexdigest()[:32]


def dead_letter_of(queue: str, method: Basic.GetOk, props: BasicProperties,
                   body: bytes) -> DeadLetter:
    """A DeadLetter from our headers, or from RabbitMQ's x-death when it dead-lettered."""
    headers = props.headers or {}
    reason = header_text(headers.get(REASON_HEADER))
    dead_at = headers.get(DEAD_AT_HEADER)
    count = header_int(headers.get(DELIVERIES_HEADER))
    if not reason:  # RabbitMQ's own dead-lettering: over the delivery limit
        why = header_text(headers.get("x-first-death-reason")) or "unknown"
        reason = f"RabbitMQ dead-lettered it ({why}): returned more often than the queue's " \
                 "x-delivery-limit"
        dead_at = death_time(headers)
        count += header_int(headers.get("x-delivery-count"))
    return DeadLetter(id=dead_id(props, body), queue=queue, body=body, reason=reason,
                      dead_at=header_float(dead_at), delivery_count=max(1, count))


def header_float(value: Any) -> float:
    """A float from a header (pika has no float type on the wire: we send text)."""
    try:
        return float(header_text(value) if isinstance(value, bytes) else value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def death_time(headers: dict[str, Any]) -> float:
    deaths = headers.get("x-death") or []
    stamp = deaths[0].get("time") if deaths and isinstance(deaths[0], dict) else None
    if isinstance(stamp, datetime):  # pika decodes AMQP timestamps as naive UTC
        return stamp.replace(tzinfo=stamp.tzinfo or UTC).timestamp()
    return float(stamp) if isinstance(stamp, int | float) else 0.0
