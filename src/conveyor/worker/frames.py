"""Frames between the supervisor, the zygote and the runners: JSON over Unix sockets (task
frames to a runner: marshal, see send_task).

All three sockets are SOCK_SEQPACKET, so one `send` is one frame and no length prefix is
needed; file descriptors ride along with SCM_RIGHTS where a frame needs them.
"""

from __future__ import annotations

import json
import marshal
import socket
from typing import Any

MAX_FRAME = 4 * 1024 * 1024


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of message-preserving sockets."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


#: One encoder for every frame: json.dumps with options builds a JSONEncoder per call, and
#: a fresh runner would build (and copy the pages of) its own for its one report.
_encoder = json.JSONEncoder(separators=(",", ":"), default=repr)


def send(sock: socket.socket, frame: dict[str, Any], fds: list[int] | None = None) -> None:
    data = _encoder.encode(frame).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def send_task(sock: socket.socket, frame: dict[str, Any]) -> None:
    """A task frame, supervisor -> runner: marshal where it can carry the frame, else JSON.

    Why not JSON: a fresh runner decodes one frame in its life, and the JSON decoder's
    first use in a process touches ~30 pages more than marshal's (each a copy-on-write
    fault in the runner: ~0.1 ms of its CPU). Both ends are the same interpreter (the zygote
    is exec'd with the supervisor's), and the frame is plain data decoded from a message;
    a value marshal cannot carry sends the frame as JSON, told apart by its first byte.
    """
    try:
        data = _MARSHALLED + marshal.dumps(frame)
    except ValueError:
        data = _encoder.encode(frame).encode()
    sock.send(data)


def recv_task(sock: socket.socket) -> dict[str, Any] | None:
    """The next task frame (see send_task), or None when the supervisor has gone."""
    try:
        data = sock.recv(MAX_FRAME)
    except ConnectionResetError:
        return None
    if not data:
        return None
    if data[:1] == _MARSHALLED:
        frame: dict[str, Any] = marshal.loads(data[1:])
        return frame
    return json.loads(data)


_MARSHALLED = b"M"  # a JSON frame starts with "{"


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame, or None when the other side has gone."""
    try:
        data = sock.recv(MAX_FRAME)
    except ConnectionResetError:
        return None
    return json.loads(data) if data else None


def recv_with_fds(sock: socket.socket, max_fds: int = 2) -> tuple[dict[str, Any] | None,
                                                                  list[int]]:
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_FRAME, max_fds)
    except ConnectionResetError:
        return None, []
    return (json.loads(data) if data else None), list(fds)
