"""Signals acted on by a thread of their own, never inside the signal handler.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a lock (a `threading.Event` being set or cleared). A handler that takes the same
lock again (`Event.set()`, `broker.wakeup()`) waits for itself forever: a second Ctrl-C
arriving during the first one's handler hung a worker that way. The handler installed here
only writes the signal's number to a pipe, which takes no lock; a daemon thread reads it and
calls the action, where any lock may be taken.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping


class SignalThread:
    """`SignalThread({signal.SIGTERM: stop})`: from the main thread; `close()` when done."""

    def __init__(self, actions: Mapping[int, Callable[[int], None]]) -> None:
        read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)
        self._actions = dict(actions)
        threading.Thread(target=self._watch, args=(read_end,), daemon=True,
                         name="conveyor-signals").start()
        for signum in self._actions:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._write_end < 0:
            return  # closed: the process is stopping already
        try:
            os.write(self._write_end, bytes([signum]))
        except BlockingIOError:
            pass  # the pipe is full of signals: the thread has enough to act on

    def _watch(self, read_end: int) -> None:
        """Until `close()` closes the write end (end of file)."""
        with open(read_end, "rb", buffering=0) as pipe:
            while signals := pipe.read(64):
                for signum in signals:
                    self._actions[signum](signum)

    def close(self) -> None:
        """Stop the thread; a signal that comes later is ignored."""
        if self._write_end >= 0:
            end, self._write_end = self._write_end, -1
            os.close(end)
