"""The triggers Conveyor ships: a time, a delay, a file appearing, an HTTP endpoint
answering, a SQL query returning rows. Each polls at `poll_interval` with `asyncio.sleep`,
so thousands of them cost the triggerer one timer each."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from conveyor.triggers.base import Trigger


@dataclass
class TimeTrigger(Trigger):
    """Fires at `at` (Unix seconds); payload: {"at": at, "fired_at": ...}."""

    at: float

    async def run(self) -> dict[str, float]:
        while (left := self.at - time.time()) > 0:
            await asyncio.sleep(min(left, 60.0))
        return {"at": self.at, "fired_at": time.time()}


@dataclass
class DelayTrigger(Trigger):
    """Fires `seconds` after the task deferred: stored as the TimeTrigger it becomes then,
    so a triggerer taking it over later does not start the delay again."""

    seconds: float

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return TimeTrigger(time.time() + self.seconds).serialize()

    async def run(self) -> dict[str, float]:
        return await TimeTrigger(time.time() + self.seconds).run()


@dataclass
class FileTrigger(Trigger):
    """Fires once `path` exists; payload: {"path", "size", "mtime"}. The file triggers of
    one interval share one poller (one timer and one pass of stat calls per interval, not
    one timer each: 2,000 of them cost a triggerer a fraction of the CPU)."""

    path: str
    poll_interval: float = 0.5

    async def run(self) -> dict[str, Any]:
        found = await _Poller.of(self.poll_interval).wait(self.path)
        return {"path": self.path, "size": found.st_size, "mtime": found.st_mtime}


class _Poller:
    """Every path waited for at one interval in one event loop, stat'ed in one pass."""

    _all: dict[tuple[int, float], _Poller] = {}

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        self.waiting: dict[str, list[asyncio.Future[os.stat_result]]] = {}
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, interval: float) -> _Poller:
        loop = asyncio.get_running_loop()
        poller = cls._all.get((id(loop), interval))
        if poller is None or poller.loop is not loop:
            poller = cls._all[(id(loop), interval)] = cls(interval)
        return poller

    async def wait(self, path: str) -> os.stat_result:
        try:
            return os.stat(path)   # there already: no wait
        except OSError:
            pass
        future: asyncio.Future[os.stat_result] = self.loop.create_future()
        self.waiting.setdefault(path, []).append(future)
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._poll())
        try:
            return await future
        finally:   # fired, or cancelled (its task no longer deferred): not waited for
            futures = self.waiting.get(path, [])
            if future in futures:
                futures.remove(future)
                if not futures:
                    del self.waiting[path]

    async def _poll(self) -> None:
        while self.waiting:
            await asyncio.sleep(self.interval)
            for path, futures in list(self.waiting.items()):
                try:
                    found = os.stat(path)
                except OSError:
                    continue
                for future in futures:
                    if not future.done():
                        future.set_result(found)


@dataclass
class HttpTrigger(Trigger):
    """Fires once a GET of `url` answers `status` (and contains `contains`, if given);
    payload: {"url", "status", "body"} (the body's first 64 KiB as text). A refused
    connection or another status is polled again."""

    url: str
    status: int = 200
    contains: str = ""
    poll_interval: float = 5.0
    request_timeout: float = 10.0

    async def run(self) -> dict[str, Any]:
        while True:
            found = await asyncio.to_thread(self._get)
            if found is not None:
                return found
            await asyncio.sleep(self.poll_interval)

    def _get(self) -> dict[str, Any] | None:
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(self.url, timeout=self.request_timeout) as answer:
                status, body = answer.status, answer.read(65536)
        except urllib.error.HTTPError as exc:
            status, body = exc.code, b""
        except (OSError, ValueError):
            return None
        text = body.decode("utf-8", "replace")
        if status != self.status or (self.contains and self.contains not in text):
            return None
        return {"url": self.url, "status": status, "body": text}


@dataclass
class SqlTrigger(Trigger):
    """Fires once `query` returns rows on `url` (postgresql:// or sqlite:///path);
    payload: {"rows": the first 100 rows as lists}."""

    url: str
    query: str
    poll_interval: float = 5.0

    async def run(self) -> dict[str, Any]:
        while True:
            rows = await asyncio.to_thread(self._rows)
            if rows:
                return {"rows": rows}
            await asyncio.sleep(self.poll_interval)

    def _rows(self) -> list[list[Any]]:
        if self.url.startswith("sqlite:"):
            import sqlite3

            from conveyor.locations import path_from_url
            path, _ = path_from_url(self.url)
            with sqlite3.connect(path, timeout=5) as db:
                return [list(row) for row in db.execute(self.query).fetchmany(100)]
        import psycopg
        with psycopg.connect(self.url, connect_timeout=10) as db:
            return [list(row) for row in db.execute(self.query.encode()).fetchmany(100)]
