"""The lease of a RabbitMQ delivery: the liveness of its connection, proven by round trips.

Why: a delivery is bound to its connection, and RabbitMQ requeues it when it closes the
connection, which it does when it has read nothing from the client for two to three
heartbeat timeouts: its receiver (rabbit_heartbeat, 3.10) reads the socket's byte count
every timeout `T` and closes the connection at the second check in a row that finds it
unchanged, so never sooner than `2 T` after the last byte it read. That is a lease that
lapses by time, and a worker cut off from the broker can reckon it: self-fencing
(worker/fencing.py) stops the runner before it lapses, so the run another worker starts
once RabbitMQ requeued the message never overlaps this one.

How: a byte RabbitMQ read proves nothing to the client unless an answer came back, so a
small request (`basic.qos` on a channel of its own, which no consumer uses) is sent without
waiting whenever pika's I/O loop runs and the last one was sent more than `T / 4` ago;
when its answer arrives, the moment it was *sent* is `proven_at`: RabbitMQ read it no
sooner, so it closes the connection no sooner than `proven_at + 2 T`. A delivery's
`lease_until` is that, stamped when it arrives and on every `extend_lease` (the worker's
heartbeat). Opening the connection is the first proof (the handshake is a round trip).
"""

from __future__ import annotations

import math
import time
from typing import Any

from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection


class Liveness:
    """Round-trip proofs that RabbitMQ still reads one connection (see the module docstring)."""

    def __init__(self, conn: BlockingConnection, opened_at: float) -> None:
        self.conn = conn
        #: the negotiated heartbeat timeout (0: none, so no lease: RabbitMQ never times out)
        params = getattr(getattr(conn, "_impl", None), "params", None)
        self.timeout = float(getattr(params, "heartbeat", 0) or 0)
        self.proven_at = opened_at
        self._sent_at: float | None = None   # the probe in flight, if any
        self._last_sent = opened_at
        #: opened with the connection (a round trip: never while the link may be cut)
        self._channel: BlockingChannel | None = conn.channel() if self.timeout > 0 else None

    @property
    def lease(self) -> float:
        """How long after a proof RabbitMQ keeps the connection at the least (`2 T`)."""
        return 2 * self.timeout if self.timeout > 0 else math.inf

    def lease_until(self) -> float:
        """When RabbitMQ may close the connection at the earliest, as far as proven."""
        return self.proven_at + self.lease

    def probe(self) -> None:
        """Send a probe if none is in flight and the last is `T / 4` old (no wait)."""
        channel = self._channel
        if channel is None or self._sent_at is not None or not channel.is_open:
            return
        sent = time.monotonic()
        if sent - self._last_sent < self.timeout / 4:
            return
        self._sent_at = self._last_sent = sent

        def answered(_frame: Any) -> None:
            self.proven_at = max(self.proven_at, sent)
            self._sent_at = None

        channel._impl.basic_qos(prefetch_count=0, callback=answered)
