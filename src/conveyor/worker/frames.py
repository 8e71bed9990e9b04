"""Frames between the supervisor, the zygote and the runners: JSON over Unix sockets (task
frames to a runner: marshal, see send_task).

All three sockets are SOCK_SEQPACKET, so one `send` is one frame and no length prefix is
needed; file descriptors ride along with SCM_RIGHTS where a frame needs them.

A datagram must fit the sender's socket buffer (net.core.wmem_default, 208 KiB on most
hosts), less than a message may be (1 MiB by default). A frame that does not fit raises the
buffer to MAX_FRAME, as far as net.core.wmem_max lets an unprivileged process, once per
socket and only then (most frames are small); one still too big raises FrameTooLarge,
which says the limit, so the message is refused in words instead of looping or vanishing.
"""

from __future__ import annotations

import errno
import json
import marshal
import socket
from typing import Any

from conveyor.errors import MessageError

MAX_FRAME = 4 * 1024 * 1024


class FrameTooLarge(MessageError):
    """A frame this host's Unix sockets cannot carry (see the module docstring)."""


class BadFrame(ValueError):
    """What arrived on a socket is not a frame."""


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of message-preserving sockets."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


#: One encoder for every frame: json.dumps with options builds a JSONEncoder per call, and
#: a fresh runner would build (and copy the pages of) its own for its one report.
_encoder = json.JSONEncoder(separators=(",", ":"), default=repr)


def send(sock: socket.socket, frame: dict[str, Any], fds: list[int] | None = None) -> None:
    _send(sock, _encoder.encode(frame).encode(), fds)


def _send(sock: socket.socket, data: bytes, fds: list[int] | None = None,
          flags: int = 0) -> None:
    """One datagram; a buffer raised for it if it needs one (see the module docstring)."""
    if len(data) > MAX_FRAME:
        raise FrameTooLarge(f"{len(data)} bytes, over the {MAX_FRAME}-byte frame limit "
                            f"between a worker and its runners")
    for attempt in (1, 2):
        try:
            if fds:
                socket.send_fds(sock, [data], fds, flags)
            else:
                sock.send(data, flags)
            return
        except OSError as exc:
            if exc.errno != errno.EMSGSIZE or attempt == 2:
                if exc.errno == errno.EMSGSIZE:
                    raise _too_large(sock, len(data)) from None
                raise
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_FRAME)


def _too_large(sock: socket.socket, size: int) -> FrameTooLarge:
    carried = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    return FrameTooLarge(f"{size} bytes, more than this host's Unix sockets carry in one "
                         f"datagram (a buffer of {carried} bytes: raise net.core.wmem_max to "
                         f"{MAX_FRAME} or more to carry it)")


def send_nowait(sock: socket.socket, frame: dict[str, Any]) -> bool:
    """Send a frame unless the other side's receive buffer is full (False then): for an
    answer the other side may never read, which must not block the sender."""
    try:
        _send(sock, _encoder.encode(frame).encode(), flags=socket.MSG_DONTWAIT)
    except (OSError, FrameTooLarge):
        return False
    return True


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
    _send(sock, data)


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
    decoded: dict[str, Any] | None = json.loads(data)
    return decoded


_MARSHALLED = b"M"  # a JSON frame starts with "{"


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame, or None when the other side has gone; BadFrame if what came is not
    a JSON object (a runner's channel is in a task's hands: anything may come)."""
    try:
        data = sock.recv(MAX_FRAME)
    except ConnectionResetError:
        return None
    if not data:
        return None
    try:
        frame = json.loads(data)
    except ValueError as exc:   # not UTF-8, or not JSON
        raise BadFrame(f"{len(data)} bytes that are not a JSON frame ({exc})") from None
    if not isinstance(frame, dict):
        raise BadFrame(f"a JSON {type(frame).__name__} where a frame is an object")
    return frame


def recv_with_fds(sock: socket.socket, max_fds: int = 2) -> tuple[dict[str, Any] | None,
                                                                  list[int]]:
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_FRAME, max_fds)
    except ConnectionResetError:
        return None, []
    return (json.loads(data) if data else None), list(fds)
