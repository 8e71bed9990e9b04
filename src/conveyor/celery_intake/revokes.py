"""Celery's `revoke()` through the intake: the control commands Celery broadcasts, heard as
one of its workers would, turned into `Client.cancel` calls.

`app.control.revoke(task_id, terminate=...)` publishes `{"method": "revoke", "arguments":
{"task_id": ..., "terminate": ..., "signal": ...}, "destination": ...}` through kombu's
`Mailbox` ("pidbox"): on the `celery.pidbox` fanout exchange on AMQP, on a pub/sub channel
(`/{db}.celery.pidbox`) on Redis. The intake listens with a kombu pidbox `Node` of its own
(queue `<hostname>.celery.pidbox`), so the wire format is kombu's on both sides.

The intake keeps the Celery task id as the Conveyor message id (conversion.py), so:
* `revoke(id)`: the message never starts (`control.unstarted_ref`); one already running goes
  on, as in Celery;
* `revoke(id, terminate=True)`: `Client.cancel(id)`: a running one is stopped too
  (`Cancelled`, then SIGKILL after the worker's --cancel-grace); Celery's `signal` is not
  used, the grace decides.
A revoke sent while no intake listens is lost, as it is for Celery workers that were down
(Celery keeps revoked ids in each worker's memory only); one heard is recorded durably.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import kombu
from kombu.mixins import ConsumerMixin
from kombu.pidbox import Mailbox

from conveyor.control import unstarted_ref

log = logging.getLogger("conveyor.celery_intake")

#: Celery's default control exchange (`control_exchange`): `celery.pidbox`.
NAMESPACE = "celery"


class Revokes(ConsumerMixin):
    """A kombu consumer thread for Celery's control commands; only `revoke` is acted on."""

    def __init__(self, connection: kombu.Connection, cancel: Callable[[str], object],
                 namespace: str = NAMESPACE,
                 canvas: Callable[[str, bool], bool] | None = None) -> None:
        """`cancel`: `Client.cancel`, given a message id or its `unstarted_ref`;
        `canvas(id, terminate)`: revokes a task of a canvas run, False if `id` is none
        (`CanvasRuns.revoke`)."""
        self.connection = connection
        self._cancel = cancel
        self._canvas = canvas
        self.mailbox = Mailbox(namespace, type="fanout", accept=["json"])
        self.hostname = f"conveyor-intake.{os.getpid()}@{socket.gethostname()}"

    def get_consumers(self, Consumer: Any, channel: Any) -> list[kombu.Consumer]:  # noqa: N803
        node = self.mailbox(self.connection).Node(self.hostname, channel=channel,
                                                   handlers={"revoke": self.revoke})

        def on_message(body: Any, message: Any) -> None:
            # only revoke: another command (inspect, ping, shutdown...) gets no answer, as
            # from a node that does not know it, rather than an error logged each time
            if isinstance(body, dict) and body.get("method") == "revoke":
                node.handle_message(body, message)

        return [node.Consumer(channel, callbacks=[on_message],
                              on_decode_error=node.on_decode_error)]

    def revoke(self, state: Any, task_id: str | list[str], terminate: bool = False,
               **ignored: Any) -> dict[str, str]:
        """Celery's `revoke` control command (`state` is the node's, unused); the reply is
        the one a Celery worker gives, sent if the caller asked for replies."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        for message_id in ids:
            if self._canvas is not None and self._canvas(message_id, terminate):
                continue
            result = self._cancel(message_id if terminate else unstarted_ref(message_id))
            log.info("Celery revoke%s of %s: %s", " (terminate)" if terminate else "",
                     message_id, getattr(result, "value", result))
        return {"ok": f"tasks {', '.join(ids)} flagged as revoked"}
