"""Signals acted on by a thread of their own, never inside the signal handler.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds a lock (a `threading.Event` being set or cleared). A handler that takes the same
lock again (`Event.set()`, `broker.wakeup()`) waits for itself forever: a second Ctrl-C
arriving during the first one's handler hung a worker that way. And it runs only once the
main thread is back in the interpreter: a worker's main thread inside a long C call (SQLite
waiting out a locked database file for up to 30 s) heard its SIGTERM that much later, and
its drain deadline with it. So the signal's number goes to a pipe from CPython's own C-level
handler, at once, whatever the main thread is doing (`signal.set_wakeup_fd`); the Python
handler does nothing, and a daemon thread reads the pipe and calls the action, where any
lock may be taken.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping


def _heard(signum: int, frame: object) -> None:
    """The Python-level handler: nothing to do, the wakeup fd carried the signal already
    (one must be installed for CPython's C handler to catch the signal at all)."""


class SignalThread:
    """`SignalThread({signal.SIGTERM: stop})`: from the main thread; `close()` there too.

    One per process at a time: the wakeup fd is the process's."""

    def __init__(self, actions: Mapping[int, Callable[[int], None]]) -> None:
        read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)
        self._actions = dict(actions)
        threading.Thread(target=self._watch, args=(read_end,), daemon=True,
                         name="conveyor-signals").start()
        self._previous_fd = signal.set_wakeup_fd(self._write_end, warn_on_full_buffer=False)
        for signum in self._actions:
            signal.signal(signum, _heard)

    def _watch(self, read_end: int) -> None:
        """Until `close()` closes the write end (end of file). Other signals the process
        handles in Python (a DAG load's SIGALRM) come through the pipe too: skipped."""
        with open(read_end, "rb", buffering=0) as pipe:
            while signals := pipe.read(64):
                for signum in signals:
                    action = self._actions.get(signum)
                    if action is not None:
                        action(signum)

    def close(self) -> None:
        """Stop the thread; a signal that comes later is ignored."""
        if self._write_end >= 0:
            end, self._write_end = self._write_end, -1
            signal.set_wakeup_fd(self._previous_fd)
            os.close(end)
