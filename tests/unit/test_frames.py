"""Task frames to a runner travel as marshal, and as JSON when marshal cannot carry them."""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator

import pytest

from conveyor.worker import frames


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = frames.pair()
    with ours, theirs:
        yield ours, theirs


def test_task_frame_round_trips_as_marshal(pair: tuple[socket.socket, socket.socket]) -> None:
    frame = {"message": {"task": "t", "args": [1, 2.5, "x", None, True],
                         "kwargs": {"a": {"b": [1, "é"]}}, "headers": {"conf": "{}"}}}
    frames.send_task(pair[0], frame)
    assert frames.recv_task(pair[1]) == frame


def test_task_frame_marshal_cannot_carry_goes_as_json(
        pair: tuple[socket.socket, socket.socket]) -> None:
    frames.send_task(pair[0], {"message": {"args": [datetime.date(2020, 1, 2)]}})
    assert frames.recv_task(pair[1]) == {"message": {"args": ["datetime.date(2020, 1, 2)"]}}


def test_task_frame_after_the_supervisor_went_away_is_none(
        pair: tuple[socket.socket, socket.socket]) -> None:
    pair[0].close()
    assert frames.recv_task(pair[1]) is None


@pytest.mark.parametrize("args", [[1], [datetime.date(2020, 1, 2)]], ids=["marshal", "json"])
def test_task_frame_carries_the_mark_runner_breakdown_finds(
        pair: tuple[socket.socket, socket.socket], args: list[object]) -> None:
    """benchmarks/runner_breakdown.py finds task frames in an strace log by these bytes
    (its TASK_FRAME: strace prints marshal's b"\\x07message" as \\7message); a frame format
    that drops them leaves every phase of its table empty, as marshal frames once did."""
    frames.send_task(pair[0], {"message": {"task": "t", "args": args}})
    data = pair[1].recv(frames.MAX_FRAME)
    assert b"\x07message" in data or data.startswith(b'{"message"')
