"""Celery's revoke command as the intake reads it (revokes.py): which cancel each asks for,
and that other control commands are not answered. The wire side runs against real Redis and
RabbitMQ in tests/integration/test_celery_intake.py."""

from __future__ import annotations

import kombu

from conveyor.celery_intake.revokes import Revokes
from conveyor.control import unstarted_ref


def test_revoke_cancels_unstarted_and_terminate_cancels_running_too() -> None:
    asked: list[str] = []
    with kombu.Connection("memory://") as connection:
        revokes = Revokes(connection, asked.append)
        reply = revokes.revoke(None, "a1", signal="SIGTERM")
        revokes.revoke(None, ["b1", "b2"], terminate=True)
    assert asked == [unstarted_ref("a1"), "b1", "b2"]
    assert reply == {"ok": "tasks a1 flagged as revoked"}


def test_only_revoke_is_handled_on_the_wire() -> None:
    asked: list[str] = []
    with kombu.Connection("memory://") as connection, connection.channel() as channel:
        revokes = Revokes(connection, asked.append)
        [consumer] = revokes.get_consumers(None, channel)
        on_message = consumer.callbacks[0]
        on_message({"method": "ping", "arguments": {}}, None)
        on_message({"method": "revoke", "arguments": {"task_id": "c1"}}, None)
    assert asked == [unstarted_ref("c1")]
