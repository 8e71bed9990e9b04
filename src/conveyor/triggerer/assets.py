"""The asset events a triggerer serves its AssetTriggers (conveyor/triggers/assets.py):
one poller per triggerer reads every event after the last id it saw, one query per poll
interval for all of them, and hands each to the triggers waiting on its URI. A trigger
new to the poller first looks back (one indexed query of its URI) for an event recorded
after it deferred and before the poller's cursor: taken over from a killed triggerer, or
claimed late, it still fires on what happened meanwhile.

On Postgres an event's id is taken when it is inserted, not when it commits: a slow
transaction commits an id below the cursor. The ids skipped over are read again for
GAP_WAIT seconds (ids a re-sent event's dedupe key burned never come, and are let go)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.state.assets import AssetEvent, Assets
from conveyor.state.store import Store

log = logging.getLogger("conveyor.triggerer")
T = TypeVar("T")
#: Events read per poll at most (the rest on the next one).
BATCH = 1000
#: How long an id skipped by the cursor is looked for (a transaction still open), and how
#: many such ids are kept at most.
GAP_WAIT, MAX_GAPS = 60.0, 10_000


@dataclass
class _Waiter:
    uri: str
    since: float
    interval: float
    future: asyncio.Future[dict[str, Any]] = field(repr=False)
    caught_up: bool = False


def payload(event: AssetEvent) -> dict[str, Any]:
    """What a fired AssetTrigger gives its task (`context.trigger_event`)."""
    return {"event_id": event.event_id, "uri": event.uri, "extra": event.extra,
            "timestamp": event.created_at, "source": event.source}


class AssetWatch:
    """Serves `AssetTrigger.run` in one triggerer's loop; `io` runs a store call on the
    triggerer's store thread."""

    def __init__(self, store: Store,
                 io: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        self.assets = Assets(store)
        self.io = io
        self.waiting: dict[str, list[_Waiter]] = {}
        self.seen: int | None = None
        self.gaps: dict[int, float] = {}   # an id skipped by the cursor: when seen missing
        self.task: asyncio.Task[None] | None = None
        self.woken = asyncio.Event()

    async def wait(self, uri: str, since: float, poll_interval: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(uri, since, max(poll_interval, 0.05), loop.create_future())
        self.waiting.setdefault(uri, []).append(waiter)
        self.woken.set()   # a newcomer looks back at the next pass, not a whole interval on
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._poll(), name="asset trigger poller")
        try:
            return await waiter.future
        finally:   # fired, or cancelled (its task no longer deferred): not waited for
            waiters = self.waiting.get(uri, [])
            if waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self.waiting[uri]

    async def _poll(self) -> None:
        while self.waiting:
            self.woken.clear()
            try:
                await self._pass()
            except Exception as exc:  # noqa: BLE001 - the store away: try again next pass
                log.warning("asset triggers could not read the asset events (%s: %s); "
                            "trying again", type(exc).__name__, exc)
            interval = min((w.interval for ws in self.waiting.values() for w in ws),
                           default=1.0)
            try:
                await asyncio.wait_for(self.woken.wait(), interval)
            except TimeoutError:
                pass

    async def _pass(self) -> None:
        new = sorted({(w.uri, w.since) for ws in self.waiting.values() for w in ws
                      if not w.caught_up})
        seen, gaps = self.seen, set(self.gaps)

        def read() -> tuple[int, list[AssetEvent]]:
            upto = self.assets.last_event_id() if seen is None else seen
            found = [e for uri, since in new
                     if (e := self.assets.first_since(uri, since, upto)) is not None]
            late = [] if not gaps else [
                e for e in self.assets.after(min(gaps) - 1, BATCH, upto=max(gaps))
                if e.event_id in gaps]
            return upto, found + late + self.assets.after(upto, BATCH)

        upto, events = await self.io(read)
        self._note_gaps(upto, events)
        for ws in self.waiting.values():
            for w in ws:
                w.caught_up = w.caught_up or (w.uri, w.since) in new
        for event in events:
            for w in self.waiting.get(event.uri, []):
                if not w.future.done() and event.created_at > w.since:
                    w.future.set_result(payload(event))
        self.seen = max([upto, *(e.event_id for e in events)])

    def _note_gaps(self, upto: int, events: list[AssetEvent]) -> None:
        """Ids read are no gap; ids the cursor skips over are, until GAP_WAIT passes."""
        now = time.time()
        expected = upto + 1
        for event in events:
            self.gaps.pop(event.event_id, None)
            if event.event_id >= expected:
                if len(self.gaps) < MAX_GAPS:
                    self.gaps.update(dict.fromkeys(
                        range(expected, min(event.event_id, expected + MAX_GAPS)), now))
                expected = event.event_id + 1
        for gap in [g for g, at in self.gaps.items() if now - at > GAP_WAIT]:
            del self.gaps[gap]
