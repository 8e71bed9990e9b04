"""Cross-process wake-ups for an embedded store that has no LISTEN/NOTIFY of its own.

Each waiting consumer binds a Unix datagram socket in Linux's abstract namespace and leaves
a marker file named after it in a shared directory next to the data file. A publisher sends
one byte to every marker's socket after it commits; a marker whose socket refuses is stale
(its process died) and is removed. Waiting is `select()` on the socket, so an idle consumer
sleeps in the kernel and a publish reaches it in well under a millisecond.
"""

from __future__ import annotations

import hashlib
import os
import select
import socket
import uuid
from pathlib import Path


class WakeChannel:
    """One consumer's wake-up socket, plus the publisher side for the whole directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prefix = "conveyor-" + hashlib.sha1(str(directory).encode()).hexdigest()[:12]
        self._sock: socket.socket | None = None
        self._name = ""

    def _address(self, name: str) -> str:
        return f"\0{self._prefix}-{name}"

    def listen(self) -> None:
        """Start receiving wake-ups (idempotent)."""
        if self._sock is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self._address(self._name))
        sock.setblocking(False)
        self._sock = sock
        (self.directory / self._name).touch()

    def wait(self, timeout: float) -> bool:
        """Sleep until woken or `timeout`; True if woken. Drains pending wake-ups."""
        assert self._sock is not None, "listen() first"
        ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        self._drain()
        return True

    def _drain(self) -> None:
        assert self._sock is not None
        try:
            while True:
                self._sock.recv(64)
        except BlockingIOError:
            return

    def wake_self(self) -> None:
        """Wake this consumer (from any thread)."""
        if self._name:
            self._send(self._name)

    def notify_all(self) -> None:
        """Wake every consumer listening in the directory; prune dead ones."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if not self._send(name):
                (self.directory / name).unlink(missing_ok=True)

    def _send(self, name: str) -> bool:
        """Send one wake byte; False only when nobody is bound there any more."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
            out.setblocking(False)
            try:
                out.sendto(b"!", self._address(name))
            except (ConnectionRefusedError, FileNotFoundError):
                return False
            except BlockingIOError:
                pass  # its buffer is full of wake-ups already: it will wake
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            (self.directory / self._name).unlink(missing_ok=True)
