"""The triggerer: one asyncio loop running the triggers of deferred DAG tasks.

A task that raises `conveyor.Defer(trigger, timeout=...)` leaves its worker slot; the
scheduler records its trigger in the state store (`conveyor_triggers`). Each triggerer
claims unfired triggers for a lease (`--lease`, renewed a third of it apart), runs each as
a coroutine (`Trigger.run`), and when one returns records the firing with its payload (one
UPDATE guarded by owner and `fired_at IS NULL`: fired once, however many triggerers ran
it) and wakes the scheduler, which queues the same attempt again with the payload in its
context. Several triggerers share the work; a killed one's triggers are claimed by the
others once its lease lapses (they may run twice meanwhile; they fire once). A trigger
gone from the store (its task timed out, was cleared or cancelled) is stopped at the next
renewal. A trigger that raises, or cannot be imported here, fails its task with the error.

The store and the broker are blocking clients: they run on one thread of their own, so
the loop only awaits them; 2,000 triggers waiting on files are 2,000 timers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from conveyor.message import new_id
from conveyor.state.store import Store
from conveyor.state.triggers import Deferral, Triggers
from conveyor.triggerer.assets import AssetWatch
from conveyor.triggers.assets import ASSET_EVENTS
from conveyor.triggers.base import TriggerError, load

log = logging.getLogger("conveyor.triggerer")
T = TypeVar("T")

#: Defaults of --lease, --poll and --capacity (settings_table.py: CONVEYOR_TRIGGERER_LEASE,
#: CONVEYOR_TRIGGERER_POLL, CONVEYOR_TRIGGERER_CAPACITY)
LEASE, POLL, CAPACITY = 10.0, 1.0, 10_000


class Triggerer:
    """Claims, runs and fires triggers; see the module docstring. `wake` tells the
    scheduler something is due (called on the store's thread)."""

    def __init__(self, store: Store, wake: Callable[[], None], *, lease: float = LEASE,
                 poll: float = POLL, capacity: int = CAPACITY,
                 triggerer_id: str = "") -> None:
        self.store = store
        self.triggers = Triggers(store)
        self.wake = wake
        self.lease, self.poll, self.capacity = lease, poll, capacity
        self.triggerer_id = triggerer_id or f"triggerer-{new_id()}"
        self.running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.fired_count = 0
        self._fired: list[tuple[Deferral, Any]] = []
        self._failed: list[tuple[Deferral, str]] = []
        self._io = ThreadPoolExecutor(1, thread_name_prefix="conveyor-triggerer-io")
        self._stop: asyncio.Event | None = None
        self._due: asyncio.Event | None = None

    async def run(self) -> None:
        """Until `stop`: claim, run, fire; on the way out, release what we hold."""
        self._stop, self._due = asyncio.Event(), asyncio.Event()
        ASSET_EVENTS.set(AssetWatch(self.store, self._io_call))   # for its AssetTriggers
        log.info("triggerer %s starting (lease %g s)", self.triggerer_id, self.lease)
        renewed = 0.0
        try:
            while not self._stop.is_set():
                await self._flush()
                now = time.time()
                if now - renewed >= self.lease / 3:
                    await self._renew(now)
                    renewed = now
                await self._claim(now)
                await self._sleep(self.poll)
        finally:
            for task in self.running.values():
                task.cancel()
            await asyncio.gather(*self.running.values(), return_exceptions=True)
            await self._flush()
            await self._io_call(lambda: self.triggers.release(self.triggerer_id))
            self._io.shutdown()
            log.info("triggerer %s stopped: %d fired", self.triggerer_id, self.fired_count)

    def stop(self) -> None:
        """Ask `run` to return (from the loop's thread: `loop.call_soon_threadsafe`)."""
        if self._stop is not None:
            self._stop.set()

    async def _sleep(self, seconds: float) -> None:
        """Until `seconds` pass, a trigger fires, or we are stopped."""
        assert self._due is not None
        try:
            await asyncio.wait_for(self._due.wait(), seconds)
        except TimeoutError:
            pass
        self._due.clear()

    async def _claim(self, now: float) -> None:
        room = self.capacity - len(self.running)
        if room <= 0:
            return
        claimed = await self._io_call(lambda: self.triggers.claim(
            self.triggerer_id, now=now, lease=self.lease, limit=room))
        for deferral in claimed:
            key = (deferral.ti_id, deferral.attempt)
            if key not in self.running:
                self.running[key] = asyncio.create_task(self._watch(deferral),
                                                        name=f"trigger {deferral.ti_id}")
        if claimed:
            log.info("claimed %d trigger(s); running %d", len(claimed), len(self.running))

    async def _renew(self, now: float) -> None:
        """Our lease renewed; triggers no longer ours (gone, or taken) stopped."""
        held = await self._io_call(lambda: self.triggers.renew(
            self.triggerer_id, now=now, lease=self.lease))
        for key in [k for k in self.running if k not in held]:
            self.running.pop(key).cancel()

    async def _watch(self, deferral: Deferral) -> None:
        """Run one trigger to its firing (or its failure)."""
        assert self._due is not None
        try:
            trigger = load(deferral.classpath, deferral.kwargs)
            payload = await trigger.run()
            json.dumps(payload)
        except asyncio.CancelledError:
            raise
        except TriggerError as exc:
            self._failed.append((deferral, str(exc)))
        except Exception as exc:  # noqa: BLE001 - a trigger's failure is its task's
            self._failed.append((deferral, f"trigger {deferral.classpath} raised "
                                           f"{type(exc).__name__}: {exc}"))
        else:
            self._fired.append((deferral, payload))
        self._due.set()

    async def _flush(self) -> None:
        """Record what fired (and failed) since the last flush; wake the scheduler."""
        fired, self._fired = self._fired, []
        failed, self._failed = self._failed, []
        if not fired and not failed:
            return
        now = time.time()

        def record() -> int:
            done = self.triggers.fire(self.triggerer_id, fired, now=now) if fired else []
            for deferral, error in failed:
                log.error("trigger of task instance %s failed: %s", deferral.ti_id, error)
                self.triggers.failed(self.triggerer_id, deferral, error, now=now)
            self.wake()
            return len(done)

        self.fired_count += await self._io_call(record)
        for deferral, _ in [*fired, *failed]:
            self.running.pop((deferral.ti_id, deferral.attempt), None)

    async def _io_call(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, call)
