"""`RabbitMQBroker`: the transport, one class built in layers, one module per role:

* `connection`: the connection, channels, declarations, and connection loss;
* `producer`: publishing;
* `consumer`: consuming in listed order, batch claims, draining, settling;
* `inspector`: depth (live counts and in-flight), `is_empty`, `watch`;
* `admin`: dead letters and purging;

each a subclass of the one before; this module adds `close` and what the class says of
itself.
"""

from __future__ import annotations

import logging

from conveyor.broker.rabbitmq.admin import RabbitMQAdmin
from conveyor.broker.rabbitmq.connection import CONNECTION_ERRORS

LOG = logging.getLogger("conveyor.broker.rabbitmq")


class RabbitMQBroker(RabbitMQAdmin):
    """Quorum queues on RabbitMQ; see the module docstring for the design."""

    supports_priority = True
    #: Guarantees of the seam this transport keeps differently (the suite skips them, saying why).
    unsupported = {"dropped_loop_give_back": (
        "deliveries RabbitMQ pushed to a consumer go back when it is paused, cancelled or its "
        "connection closes, not when a consume loop is merely dropped")}
    weaker_guarantees = (
        "RabbitMQ: priorities in four bands (0, 1-3, 4-6, 7+; FIFO within a band); a delivery "
        "held longer than the broker's consumer timeout is redelivered; other consumers' "
        "in-flight counts lag by ~5-10 s")

    # -- close ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Send owed acks, then close the connection: unsettled deliveries are redelivered."""
        sub = self._sub
        if sub is not None and not sub.lost:
            try:
                self._flush(sub)
            except CONNECTION_ERRORS as exc:
                LOG.warning("closing: %d ack(s) could not be sent (%r); those messages will "
                            "be redelivered", len(sub.ledger.owed), exc)
        self._drop_connection()
        self._sub = None
        self._want = None
