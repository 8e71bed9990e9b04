"""Results in the state store (SQLite or Postgres): a `conveyor_results` table.

`put` is one statement: it inserts unless a live record is there (first write wins) and, on
Postgres, sends a `pg_notify` in the same commit; `wait` LISTENs before it reads, so it
sleeps until the notification. SQLite has no notifications across processes: the writer
wakes waiters through the same kind of Unix-socket wake channel the SQLite broker uses, in
a directory beside the database file. Expired rows are deleted by writers, at most once a
minute each.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from conveyor.broker.wake import WakeChannel
from conveyor.errors import StateStoreLost
from conveyor.results.base import ResultRecord, ResultStore
from conveyor.state import store as stores
from conveyor.state.monitoring import Results

#: Seconds between one writer's sweeps of expired records.
SWEEP_INTERVAL = 60.0


class SQLResults(ResultStore):
    def __init__(self, url: str) -> None:
        self.store = stores.from_url(url)
        self.results = Results(self.store)
        self._next_sweep = 0.0
        self._wake: WakeChannel | None = None
        self._channel = ""
        if isinstance(self.store, stores.SQLiteStore):
            path: Path = self.store.path
            self._wake = WakeChannel(path.parent / f".{path.name}.results-wake")
        elif isinstance(self.store, stores.PostgresStore):
            self._channel = channel_name(self.store.schema)

    def put(self, message_id: str, record: ResultRecord, ttl: float) -> bool:
        now = time.time()
        stored = self.results.put(message_id=message_id, now=now, ttl=ttl,
                                  record=record.encode().decode(), channel=self._channel)
        if stored and self._wake is not None:
            self._wake.notify_all()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_INTERVAL
            self.results.forget_expired(now)
        return stored

    def get(self, message_id: str) -> ResultRecord | None:
        record = self.results.get(message_id, time.time())
        return None if record is None else ResultRecord.decode(record.encode())

    def wait(self, message_id: str, timeout: float) -> ResultRecord | None:
        deadline = time.monotonic() + timeout
        self._listen()
        found = self.get(message_id)
        while found is None and (remaining := deadline - time.monotonic()) > 0:
            if self._sleep(message_id, remaining):
                found = self.get(message_id)
        return found

    def _listen(self) -> None:
        if self._wake is not None:
            self._wake.listen()
        elif isinstance(self.store, stores.PostgresStore):
            self.store.listen(self._channel)

    def _sleep(self, message_id: str, timeout: float) -> bool:
        """Until something was stored (maybe ours) or `timeout`; True if woken."""
        if self._wake is not None:
            return self._wake.wait(timeout)
        assert isinstance(self.store, stores.PostgresStore)
        try:
            return message_id in self.store.notifications(timeout)
        except StateStoreLost:   # a failover: a notification may be lost with it; read again
            return True

    def close(self) -> None:
        if self._wake is not None:
            self._wake.close()
        self.store.close()


def channel_name(schema: str) -> str:
    """The NOTIFY channel of one schema's results (an identifier: at most 63 bytes)."""
    if not schema:
        return "conveyor_results"
    return "conveyor_results_" + hashlib.sha1(schema.encode()).hexdigest()[:16]
