"""Frames between the supervisor, the zygote and the runners: JSON over Unix sockets.

All three sockets are SOCK_SEQPACKET, so one `send` is one frame and no length prefix is
needed; file descriptors ride along with SCM_RIGHTS where a frame needs them.
"""

from __future__ import annotations

import json
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
