"""kombu messages as deliveries and dead letters: receipts and the headers Conveyor adds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kombu.message import Message as KombuMessage

from conveyor.broker.base import DeadLetter
from conveyor.broker.kombu.settings import (
    DEAD_AT_HEADER,
    DELIVERIES_HEADER,
    ID_HEADER,
    REASON_HEADER,
)


@dataclass(eq=False)
class Receipt:
    """Which connection a delivery came on: settling it on a newer one is impossible."""

    message: KombuMessage
    queue: str
    epoch: int
    done: bool = False


def _header_int(headers: dict[str, Any], name: str) -> int:
    try:
        return int(headers.get(name) or 0)
    except (TypeError, ValueError):
        return 0


def _header_float(headers: dict[str, Any], name: str) -> float:
    try:
        return float(headers.get(name) or 0.0)
    except (TypeError, ValueError):
        return 0.0


def delivery_count(message: KombuMessage) -> int:
    """Deliveries so far: carried ones, this one, and one more if kombu says redelivered."""
    headers = message.headers or {}
    redelivered = bool((message.delivery_info or {}).get("redelivered"))
    return _header_int(headers, DELIVERIES_HEADER) + 1 + int(redelivered)


def dead_letter_of(queue: str, message: KombuMessage) -> DeadLetter:
    headers = message.headers or {}
    reason = headers.get(REASON_HEADER) or "unknown"
    return DeadLetter(id=str(headers.get(ID_HEADER) or message.delivery_tag), queue=queue,
                      body=message.body, reason=str(reason),
                      dead_at=_header_float(headers, DEAD_AT_HEADER),
                      delivery_count=max(1, _header_int(headers, DELIVERIES_HEADER)))
