"""The runners' default client is built once per lane (followups.prepare); each runner
gives it its own channel (followups.install), and one without a channel refuses in words."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from conveyor import client
from conveyor.errors import ConveyorError
from conveyor.message import Message
from conveyor.worker import followups, frames


@pytest.fixture
def lane() -> Iterator[None]:
    """As a lane leaves this process; the default client and the prepared one restored."""
    before = client._inside_task, followups._prepared
    followups.prepare()
    yield
    client._inside_task, followups._prepared = before


def test_prepared_client_refuses_without_a_channel(lane: None) -> None:
    with pytest.raises(ConveyorError, match="not a runner"):
        client.default_client().enqueue(Message(task="t", queue="q"))


def test_install_gives_the_prepared_client_its_channel(lane: None) -> None:
    ours, theirs = frames.pair()
    with ours, theirs:
        followups.install(theirs)
        task_client = client.default_client()
        assert task_client is followups._prepared
        assert isinstance(task_client, followups.TaskClient)
        ours.settimeout(5)
        frames.send(ours, {"op": "enqueued", "seq": 1, "id": "m1", "headers": {},
                           "not_before": 0.0})
        handle = task_client.enqueue(Message(task="t", queue="q"))
        asked = frames.recv(ours)
    assert handle.id == "m1"
    assert asked is not None and asked["op"] == "enqueue" and asked["seq"] == 1


def test_install_without_a_prepared_client_builds_one() -> None:
    before = client._inside_task, followups._prepared
    followups._prepared = None
    try:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            followups.install(theirs)
            task_client = client.default_client()
            assert isinstance(task_client, followups.TaskClient)
            assert task_client.channel is theirs
    finally:
        client._inside_task, followups._prepared = before
