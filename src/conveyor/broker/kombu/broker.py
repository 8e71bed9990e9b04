"""`KombuBroker`: the transport, one class built in layers, one module per role:

* `connection`: the connection, its channel, declarations, and connection loss;
* `producer`: publishing, and delay levels;
* `consumer` (with `subscription`): consuming, moving due messages, settling, wake-ups;
* `inspector`: depth;
* `admin`: dead letters and purging;

each a subclass of the one before; this module adds `close`.
"""

from __future__ import annotations

from conveyor.broker.kombu.admin import KombuAdmin


class KombuBroker(KombuAdmin):
    """The broker seam over kombu's portable API; see the package docstring for its limits."""

    def close(self) -> None:
        """Close the connections: unsettled deliveries go back to their queues."""
        if self._closed:
            return
        self._closed = True
        self._want = None
        self._drop()  # the channels' close returns what they hold, buffered ones too
        with self._lock:
            if self._waker is not None:
                self._waker.release()
                self._waker = None
