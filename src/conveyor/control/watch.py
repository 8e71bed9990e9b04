"""A worker's view of what is cancelled: every live id, in memory, kept current by a thread.

At start the worker subscribes to the control channel and then reads every live record
(in that order: an id announced between the two is heard, never lost); from then on the
channel's ids are added as they come. When the subscription breaks (a restart of the
server, a partition), it subscribes again and reads the records again, so a cancel made
meanwhile is found. Checking a delivery (`id in watch`) is then a set lookup: the claim
path pays no round trip.

`on_cancel` is called (on the watch's thread) with each id newly known, so the supervisor
can stop a run it holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from conveyor.control import CANCEL_TTL
from conveyor.control.channel import Channel, Subscription
from conveyor.limits import Limiter

log = logging.getLogger("conveyor.worker")
#: Seconds between two attempts to subscribe again after the channel broke.
RESUBSCRIBE = 1.0
#: Seconds between two sweeps of the ids whose records have lapsed.
FORGET_EVERY = 3600.0


class CancelWatch:
    """`message_id in watch`: whether it was cancelled (from any thread)."""

    def __init__(self, channel: Channel, open_records: Callable[[], Limiter],
                 on_cancel: Callable[[str], None] = lambda message_id: None) -> None:
        self._channel = channel
        self._open_records = open_records
        self._records: Limiter | None = None
        self.on_cancel = on_cancel
        self._ids: dict[str, float] = {}  # id -> when this worker heard of it
        self._sub: Subscription | None = None
        self._failing = False  # the last read of the records failed (said once)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cancel-watch", daemon=True)
        self._release_lock = threading.Lock()
        self._exited = False   # the thread has left its loop
        self._closing = False  # close() left the release to the thread
        self._next_forget = time.monotonic() + FORGET_EVERY
        self._read = threading.Event()  # the first read of the records is done (or failed)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._ids

    def start(self) -> CancelWatch:
        """Subscribe and read the records before the first delivery is taken (a failure is
        logged, and retried on the watch's thread), then watch."""
        self._resubscribe()
        self._read.set()
        self._thread.start()
        return self

    def start_behind(self) -> CancelWatch:
        """`start`, with the subscription and the first read made on the watch's thread:
        the caller goes on meanwhile and calls `wait_read` before its first delivery.

        Why: a worker's first read (a connection, a subscription, the records: 100-200 ms
        at load 6-21 on RabbitMQ) then overlaps its wait for the runner pool instead of
        following it on the way to the first task."""
        self._thread.start()
        return self

    def wait_read(self) -> None:
        """Return once the first read of the records is done (a failure is logged, and
        retried on the watch's thread, as in `start`)."""
        self._read.wait()

    def close(self) -> None:
        """Stop watching, without waiting out the thread's wait on the channel (up to a
        second, at every worker stop): a thread still in its loop releases the channel
        itself when that wait ends (it alone uses it then); else it is released here."""
        self._stop.set()
        with self._release_lock:
            if self._thread.ident is not None and not self._exited:
                self._closing = True
                return
        self._release()

    def _release(self) -> None:
        for closing in (self._sub, self._records):
            if closing is not None:
                _quietly(closing.close)
        self._channel.close()

    def _watch(self) -> None:
        try:
            if not self._read.is_set():  # start_behind: the first read is this thread's
                try:
                    self._resubscribe()
                finally:
                    self._read.set()
            self._listen()
        finally:
            with self._release_lock:
                self._exited = True
                closing = self._closing
            if closing:
                self._release()

    def _listen(self) -> None:
        while not self._stop.is_set():
            if self._sub is None and not self._resubscribe():
                self._stop.wait(RESUBSCRIBE)
                continue
            assert self._sub is not None
            try:
                heard = self._sub.next(1.0)
            except Exception as exc:  # noqa: BLE001 - any server's own errors
                log.warning("the cancel channel broke (%s): listening again in %g s, then "
                            "reading the cancel records", exc, RESUBSCRIBE)
                _quietly(self._sub.close)
                self._sub = None
                self._stop.wait(RESUBSCRIBE)
                continue
            self._add(heard)
            if time.monotonic() > self._next_forget:
                self._next_forget = time.monotonic() + FORGET_EVERY
                self._forget_lapsed()

    def _resubscribe(self) -> bool:
        """Subscribe, then read every live record; whether both worked."""
        try:
            self._sub = self._channel.subscribe()
            if self._records is None:
                self._records = self._open_records()
            found = self._records.cancels(time.time())
        except Exception as exc:  # noqa: BLE001 - any server's own errors
            if not self._failing:  # once per outage, not every second of it
                log.warning("cannot read the cancel records (%s): cancels reach this "
                            "worker once it can", exc)
            self._failing = True
            for closing in (self._sub, self._records):
                if closing is not None:
                    _quietly(closing.close)
            self._sub = self._records = None
            return False
        if self._failing:
            log.warning("cancel records read again: %d live", len(found))
            self._failing = False
        self._add(found)
        self._forget_lapsed()
        return True

    def _add(self, ids: list[str]) -> None:
        now = time.time()
        for message_id in ids:
            if message_id in self._ids:
                continue
            self._ids[message_id] = now
            try:
                self.on_cancel(message_id)
            except Exception:  # noqa: BLE001 - the watch must go on
                log.exception("acting on the cancel of %s failed", message_id)

    def _forget_lapsed(self) -> None:
        """Drop ids whose records have lapsed (a new dict: readers never see it change
        size under them)."""
        oldest = time.time() - CANCEL_TTL
        if any(at < oldest for at in self._ids.values()):
            self._ids = {i: at for i, at in self._ids.items() if at >= oldest}


def _quietly(close: Callable[[], None]) -> None:
    try:
        close()
    except Exception:  # noqa: BLE001 - closing what already broke
        return
