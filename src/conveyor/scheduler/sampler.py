"""Queue depth and throughput over time, for the dashboard's charts: the scheduler samples.

Every `interval` seconds a thread of its own reads the depth (ready, in flight, delayed,
dead) of the queues in use, through a broker connection of its own, and writes one row per
queue to the state store, stamped with the start of its sampling period: two schedulers
sharing a store write each period once. Rows older than `RETENTION` are deleted as it goes.
Each row also holds the tasks that succeeded and failed on that queue since the previous
sample: the growth of the counts every registered worker puts on its heartbeat (a worker
seen for the first time counts from its start; the sampler's first period has no counts).

Why the scheduler: it is the one daemon every deployment runs, and it already holds the
broker and state-store settings. Why a thread: a depth read can be slow (RabbitMQ answers
from its management API, which can take seconds) and must never delay dispatch, so the
main loop never waits for it. Monitoring never stops work: a failure is logged once and
tried again next period. Idle cost: one depth read per queue and one small transaction per
period (15 s by default), nothing in between.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from conveyor.broker import Depth, Inspector
from conveyor.kinds import pinned_queue
from conveyor.state.monitoring import QueueSamples, Workers
from conveyor.state.records import WorkerRecord
from conveyor.state.tasks import TaskInstances

if TYPE_CHECKING:
    from conveyor.state.store import Store

log = logging.getLogger("conveyor.scheduler")

#: Seconds between samples unless configured (`--queue-sample-interval`; 0 turns it off).
DEFAULT_INTERVAL = 15.0
#: Seconds samples are kept: the chart shows the last hour, with room to scroll back.
RETENTION = 3 * 3600.0
#: How many recent runs name the queues worth sampling.
RECENT_RUNS = 200


def queues_to_sample(store: Store, always: Sequence[str]) -> list[str]:
    """`always`, then the queues registered workers serve and recent runs' tasks name
    (`conveyor status` and the dashboard show these too, and the Celery rejects). A worker
    announcing a code version also serves `<queue>@<version>` for each of its queues, and
    a pinned task names the one it went to: a backlog pinned to an old version shows."""
    found = list(always)
    for worker in Workers(store).all():
        queues = worker.queues.split(",")
        found += queues
        if worker.code_version:
            found += [pinned_queue(q, worker.code_version) for q in queues if q]
    found += TaskInstances(store).queues_in_use(RECENT_RUNS)
    return list(dict.fromkeys(q for q in found if q))


def period_start(now: float, interval: float) -> float:
    """The start of the sampling period `now` falls in (what a sample is stamped with)."""
    return now - now % interval


#: worker id -> queue -> (succeeded, failed) since that worker started
Counts = dict[str, dict[str, tuple[int, int]]]


def sample(store: Store, broker: Inspector, queues: Sequence[str], now: float,
           interval: float, finished: Mapping[str, tuple[int, int]] | None = None
           ) -> dict[str, Depth]:
    """Read each queue's depth and record it for the period of `now`, with the tasks
    `finished` on it since the last sample (None: not known); forget old samples.

    Depths are read before the transaction opens: a slow broker never holds a write lock.
    """
    names = list(dict.fromkeys([*queues, *(finished or {})]))
    depths = {queue: broker.depth(queue) for queue in names}
    at = period_start(now, interval)
    samples = QueueSamples(store)
    with store.transaction():
        for queue, d in depths.items():
            done: tuple[int | None, int | None] = (None, None) if finished is None else \
                finished.get(queue, (0, 0))
            samples.insert(at=at, queue=queue, ready=d.ready, in_flight=d.in_flight,
                           delayed=d.delayed, dead=d.dead, succeeded=done[0], failed=done[1])
        samples.forget(now - RETENTION)
    return depths


def worker_counts(workers: Sequence[WorkerRecord]) -> Counts:
    """What each registered worker says it finished per queue (from its heartbeat row)."""
    counts: Counts = {}
    for worker in workers:
        reported = worker.runners or {}
        counts[worker.worker_id] = {q: (int(s), int(f)) for q, (s, f)
                                    in reported.get("finished", {}).items()}
    return counts


def growth(before: Counts, now: Counts) -> dict[str, tuple[int, int]]:
    """Per queue, how much the workers' counts grew (a worker new since `before` counts from
    its start; one that is gone adds nothing)."""
    grown: dict[str, tuple[int, int]] = {}
    for worker, queues in now.items():
        for queue, (succeeded, failed) in queues.items():
            was = before.get(worker, {}).get(queue, (0, 0))
            total = grown.get(queue, (0, 0))
            grown[queue] = (total[0] + max(0, succeeded - was[0]),
                            total[1] + max(0, failed - was[1]))
    return grown


class Sampler:
    """Samples every `interval` seconds on its own thread, from `start()` until `close()`."""

    def __init__(self, state_url: str, open_broker: Callable[[], Inspector], interval: float,
                 always: Sequence[str], clock: Callable[[], float] = time.time) -> None:
        self.state_url = state_url
        self.interval = interval
        self.always = tuple(always)
        self.clock = clock
        self._open_broker = open_broker
        self._broker: Inspector | None = None
        self._store: Store | None = None
        self._counts: Counts | None = None    # the workers' counts at the last sample
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="conveyor-queue-sampler",
                                        daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                now = self.clock()
                self.run_once(now)
                next_at = period_start(now, self.interval) + self.interval
                self._stop.wait(max(0.0, next_at - self.clock()))
        finally:
            self._release()

    def run_once(self, now: float) -> None:
        """One sample; a failure is logged (once until it works again), never raised."""
        try:
            store, broker = self._open()
            counts = worker_counts(Workers(store).all())
            finished = None if self._counts is None else growth(self._counts, counts)
            sample(store, broker, queues_to_sample(store, self.always), now, self.interval,
                   finished)
            self._counts = counts
        except Exception as exc:  # monitoring must never stop the scheduler
            if not self._failing:
                log.warning("queue sampler: cannot record queue depth (%s: %s); the "
                            "dashboard's chart has a gap until it can", type(exc).__name__,
                            exc)
            self._failing = True
            self._release()
            return
        if self._failing:
            log.info("queue sampler: recording queue depth again")
            self._failing = False

    def _open(self) -> tuple[Store, Inspector]:
        if self._store is None:
            from conveyor.state import store as stores
            self._store = stores.from_url(self.state_url)
        if self._broker is None:
            self._broker = self._open_broker()
        return self._store, self._broker

    def _release(self) -> None:
        """Close both connections (after a failure: the next sample opens fresh ones)."""
        for closing in (self._broker, self._store):
            if closing is not None:
                try:
                    closing.close()
                except Exception as exc:  # a broken connection may fail to close too
                    log.debug("queue sampler: closing failed: %s", exc)
        self._broker = self._store = None

    def close(self, timeout: float = 5.0) -> None:
        """Stop sampling; a depth read in progress is given `timeout` seconds to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif self._thread.ident is None:   # never started: samples were taken by hand
            self._release()
