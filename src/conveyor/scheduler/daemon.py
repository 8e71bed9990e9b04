"""`conveyor scheduler`: a thin loop around the engine's steps.

It blocks on the broker for its events queue (and a control queue that `dags trigger` and
`submit` poke), applies each event as it arrives, and ticks the engine when the earliest
deadline the engine reported comes due: a `Waker` thread sleeps until then and calls
`broker.wakeup()`, the seam's one thread-safe method. Executors that watch their own work
(local, kubernetes) hand events to `report`, which queues them for the main thread and
wakes it the same way. So an idle scheduler sleeps in the kernel; nothing polls.

With a DAGs folder to watch (`watch`), the loop also looks at it every
`dags_reload_interval` seconds (a stat per file) and on SIGHUP, and runs what the files
declare now: see `folder.py`. Runs in progress keep the version they started with.

Everything touching the store or the broker runs on the main thread. If an executor's
background thread dies, or an event cannot be applied, the loop stops with the error: the
process manager restarts a clean process, and unsettled events are delivered again. One
error is waited out instead: the state store's session lost in a step (Postgres failed over
to its standby, `StateStoreLost`). Every step is idempotent (each transition is guarded by
the state it expects), so the step is run again once the store answers (`_steady`); the store
gives up, and the loop stops, if no primary answers within its `retry_seconds`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import TypeVar

from conveyor import broker as brokers
from conveyor.broker import Consumer, Delivery
from conveyor.client import Client
from conveyor.errors import LeaseLost, MessageError, StateStoreLost
from conveyor.events import Event
from conveyor.message import new_id
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.executors import Executor
from conveyor.scheduler.executors.queue import QueueExecutor
from conveyor.scheduler.folder import DagFolder
from conveyor.scheduler.lease import SchedulerLease
from conveyor.scheduler.sampler import Sampler
from conveyor.state import store as stores
from conveyor.tasks import REGISTRY

log = logging.getLogger("conveyor.scheduler")
T = TypeVar("T")

#: Longest sleep without a tick, a safety net only: deadlines wake the loop on time.
IDLE_TICK = 30.0
PREFETCH = 64
#: An event that failed to apply this many times is set aside instead of stopping us again.
MAX_EVENT_DELIVERIES = 5


class Waker:
    """Calls `wake` when the earliest requested time arrives: one thread, no polling."""

    def __init__(self, wake: Callable[[], None], clock: Callable[[], float] = time.time) -> None:
        self._wake = wake
        self._clock = clock
        self._at: float | None = None
        self._closed = False
        self._fired = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="conveyor-scheduler-waker",
                                        daemon=True)
        self._thread.start()

    def at(self, when: float | None, *, replace: bool = False) -> None:
        """Wake at `when` if that is earlier than the time set (or instead of it)."""
        with self._cond:
            if replace or (when is not None and (self._at is None or when < self._at)):
                self._at = when
                self._cond.notify()

    def fired(self) -> bool:
        """Whether the alarm went off since the last call."""
        was = self._fired.is_set()
        self._fired.clear()
        return was

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                delay = None if self._at is None else self._at - self._clock()
                if delay is None or delay > 0:
                    self._cond.wait(delay)
                    continue
                self._at = None
                self._fired.set()
                self._wake()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)


class Daemon:
    """Consume events, apply them, tick on deadlines; `stop()` from any thread ends it."""

    def __init__(self, engine: Engine, broker: Consumer, executors: Mapping[str, Executor], *,
                 events_queue: str, control_queue: str) -> None:
        self.engine = engine
        self.broker = broker
        self.executors = executors
        self.queues = [events_queue, control_queue]
        self.inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.waker = Waker(broker.wakeup)
        self._stop = threading.Event()
        self._renewed = time.monotonic()
        #: Records queue depth for the dashboard, on its own thread (None: not sampling).
        self.sampler: Sampler | None = None
        #: This scheduler's lease in the state store, on its own thread (None: none kept,
        #: so what it claims is published by others only once its claims' deadlines pass).
        self.lease: SchedulerLease | None = None
        #: Called with each applied event's lag (now minus its timestamp), for metrics.
        self.on_applied: Callable[[float], None] = lambda lag: None
        #: Called with the number of DAG load errors after a look that changed something.
        self.on_reloaded: Callable[[int], None] = lambda errors: None
        self.folder: DagFolder | None = None
        self.reload_interval = 0.0
        self._look_at = float("inf")
        engine.on_deadline = self.waker.at

    def watch(self, folder: DagFolder, interval: float) -> None:
        """Run what `folder` declares, looking again every `interval` seconds (0: only when
        `reload()` asks)."""
        self.folder = folder
        self.reload_interval = interval
        self._look_at = time.monotonic() + interval if interval else float("inf")

    def reload(self) -> None:
        """Look at the DAGs folder now (from any thread or a signal handler: SIGHUP)."""
        self._look_at = 0.0
        self.broker.wakeup()

    def report(self, event: Event) -> None:
        """Take an executor's event (from any thread) for the main loop to apply."""
        self.inbox.put(event)
        self.broker.wakeup()

    def stop(self) -> None:
        """Leave the loop after the event in hand (from any thread or a signal handler)."""
        self._stop.set()
        self.broker.wakeup()

    def run(self, *, burst: bool = False) -> None:
        """Until `stop()`, or with `burst` until no run is queued or running."""
        if self.lease is not None:   # held before anything is claimed under it
            self.lease.start()
        for executor in self.executors.values():
            executor.start(self.report)
        if self.sampler is not None:
            self.sampler.start()
        self._steady("recording the DAGs", lambda: self.engine.sync_dags(time.time()))
        self._tick()
        finished = ticked_at = self.engine.runs_finished
        idle = min(IDLE_TICK, self.reload_interval or IDLE_TICK)
        steps = self.broker.consume(self.queues, prefetch=PREFETCH, timeout=idle)
        for delivery in steps:
            for executor in self.executors.values():
                executor.check()
            reloaded = self._look()
            self._drain_inbox()
            poked = delivery is not None and self._receive(self._batch(delivery, steps))
            self._renew_leases()
            ended = self.engine.runs_finished != ticked_at   # catch-up may continue
            ticked = poked or ended or reloaded or delivery is None or self.waker.fired()
            if ticked:
                ticked_at = self.engine.runs_finished
                self._tick()
            if self._stop.is_set():
                return
            if burst and (ticked or self.engine.runs_finished != finished):
                finished = self.engine.runs_finished
                if self._idle():
                    return

    def _batch(self, first: Delivery, steps: Generator[Delivery | None, float | None, None]
               ) -> list[Delivery]:
        """`first` and the deliveries claimed with it, not handed out yet: applied together.
        A scheduler that falls behind claims many at once, so it catches up in batches."""
        batch = [first]
        while self.broker.claimed_ahead:
            more = steps.send(0.0)
            if more is None:
                break
            batch.append(more)
        return batch

    def _steady(self, what: str, step: Callable[[], T]) -> T:
        """`step()`, run again while the state store's session is lost in it (a failover;
        stores.through_losses), until `stop()`."""
        return stores.through_losses(what, step, self._stop)

    def _look(self) -> bool:
        """Reload the DAG files that changed, if a look is due; True if a DAG changed."""
        now = time.monotonic()
        if self.folder is None or now < self._look_at:
            return False
        self._look_at = now + self.reload_interval if self.reload_interval else float("inf")
        changes = self.folder.refresh()
        for change in changes:
            (log.warning if change.error else log.info)("%s", change)
        if not changes:
            return False
        dags = self.folder.dags
        self._steady("recording reloaded DAGs", lambda: self.engine.use_dags(
            dags, {c.dag_id for c in changes if c.new}, time.time()))
        default = next(iter(self.executors), "")
        for name, executor in self.executors.items():
            executor.use_apps(task_modules(dags, name, default))
        self.on_reloaded(len(self.folder.errors))
        return True

    def _renew_leases(self) -> None:
        """Keep the events claimed in a batch ours while we work through them (a third of
        the lease apart): a live scheduler keeps them, a killed one's come back soon."""
        now = time.monotonic()
        if now - self._renewed >= self.broker.lease_seconds / 3:
            self._renewed = now
            self.broker.renew_claimed()

    def _tick(self) -> None:
        self.waker.at(self._steady("tick", lambda: self.engine.tick(time.time())),
                      replace=True)

    def _drain_inbox(self) -> None:
        events = []
        while True:
            try:
                events.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        if events:
            now = time.time()
            self._steady("applying executor events",
                         lambda: self.engine.handle_many(events, now))
            for event in events:
                self.on_applied(now - event.at)

    def _receive(self, deliveries: list[Delivery]) -> bool:
        """Apply a batch of deliveries; True if one was a poke asking for a tick."""
        poked = False
        events: list[tuple[Delivery, Event]] = []
        for delivery in deliveries:
            if delivery.queue == self.queues[1]:
                self.broker.ack(delivery)
                poked = True
                continue
            try:
                events.append((delivery, Event.decode(delivery.body)))
            except MessageError as exc:
                self.broker.dead_letter(delivery, f"not a scheduler event: {exc}")
        if len(events) > 1:
            self._apply_together(events)
        elif events:
            self._apply_alone(*events[0])
        return poked

    def _apply_together(self, events: list[tuple[Delivery, Event]]) -> None:
        """Apply events in as few transactions as their runs allow, then ack each. If that
        fails, each is applied alone (what was applied changes nothing the second time), so
        the others are acked and only the one that fails comes back, or is set aside."""
        now = time.time()
        try:
            self.engine.handle_many([event for _, event in events], now)
        except StateStoreLost as exc:   # said in one line: no traceback helps here
            log.warning("a batch of %d events was cut off (%s); applying each alone",
                        len(events), exc)
        except Exception:
            log.info("a batch of %d events failed to apply; applying each alone",
                     len(events), exc_info=True)
        else:
            for _, event in events:
                self.on_applied(now - event.at)
            lost = {id(d) for d in self.broker.ack_many([d for d, _ in events])}
            for delivery, event in events:   # one transaction or round trip for the batch
                if id(delivery) in lost:
                    log_lapsed(event)
            return
        failures = []
        for delivery, event in events:
            try:
                self._apply_alone(delivery, event)
            except Exception as exc:  # noqa: BLE001 - raised below, after the others
                failures.append(exc)
        if failures:
            raise failures[0]

    def _apply_alone(self, delivery: Delivery, event: Event) -> None:
        """Apply one event and ack it; if it fails, stop (it comes back to a clean process),
        unless it failed as often as MAX_EVENT_DELIVERIES: then set it aside."""
        now = time.time()
        try:
            self._steady(f"applying event {event.kind} of {event.message_id}",
                         lambda: self.engine.handle(event, now))
        except Exception as exc:
            if delivery.delivery_count < MAX_EVENT_DELIVERIES:
                raise
            log.exception("event %s of %s failed %d times: set aside", event.kind,
                          event.message_id, delivery.delivery_count)
            self.broker.dead_letter(delivery, f"the scheduler failed to apply this event "
                                              f"{delivery.delivery_count} times: {exc!r}")
            return
        self.on_applied(now - event.at)
        self._ack(delivery, event)

    def _ack(self, delivery: Delivery, event: Event) -> None:
        """Ack without waiting for the answer where the transport can (Redis: a batch's
        acks share one round trip with the next claim); a lost lease is only logged."""
        try:
            self.broker.ack_soon(delivery)
        except LeaseLost:
            log_lapsed(event)

    def _idle(self) -> bool:
        """Nothing left for a burst: no run queued or running, no callback to publish."""
        return (self.inbox.empty() and not self.engine.runs.active_count()
                and self.engine.callbacks.next_due() is None)

    def close(self) -> None:
        self.waker.close()
        if self.sampler is not None:
            self.sampler.close()
        if self.lease is not None:
            self.lease.close()
        for executor in self.executors.values():
            executor.close()
        self.broker.close()
        self.engine.store.close()


def log_lapsed(event: Event) -> None:
    """An event acked after its lease lapsed: applied meanwhile elsewhere, or again later;
    both are no-ops."""
    log.info("event %s of %s applied after its lease lapsed; another scheduler may apply it "
             "too, which changes nothing", event.kind, event.message_id)


def make_executors(config: SchedulerConfig, dags: Mapping[str, DAG]) -> dict[str, Executor]:
    """The configured executors, in order (the first is the default)."""
    made: dict[str, Executor] = {}
    for name in config.executors:
        if name == "queue":
            client = Client(brokers.from_url(config.settings.broker_url),
                            config.settings.codec())
            made[name] = QueueExecutor(client)
        elif name == "local":
            from conveyor.scheduler.executors.local import LocalExecutor
            made[name] = LocalExecutor(slots=config.local_slots,
                                       apps=task_modules(dags, "local", config.executors[0]),
                                       dags_folder=config.dags_folder)
        elif name == "kubernetes":
            from conveyor.scheduler.executors.kubernetes import KubernetesExecutor
            made[name] = KubernetesExecutor.from_config(config)
    return made


def task_modules(dags: Mapping[str, DAG], executor: str, default: str) -> list[str]:
    """The importable modules registering the tasks that `dags` run on `executor`, and
    the callbacks sent there (a task's go to its executor; a DAG's and its deadline's to
    the default one)."""
    names = {name for dag in dags.values() for node in dag.tasks.values()
             if (node.options.executor or default) == executor
             for name in (node.task, *(c["task"] for c in node.callbacks.values())) if name}
    if executor == default:
        names |= {c["task"] for dag in dags.values() for c in dag.callbacks.values()}
        names |= {dag.deadline["callback"]["task"] for dag in dags.values()
                  if dag.deadline and dag.deadline["callback"]}
    modules = {REGISTRY[name].fn.__module__ for name in names if name in REGISTRY}
    return sorted(m for m in modules if importable(m))


def importable(module: str) -> bool:
    try:
        return module != "__main__" and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def build(config: SchedulerConfig, dags: Mapping[str, DAG]) -> Daemon:
    """A scheduler daemon for `config` running `dags`: store migrated, executors ready."""
    store = stores.from_url(config.settings.state_url)
    executors = make_executors(config, dags)
    scheduler_id = f"scheduler-{new_id()}"
    engine = Engine(store, executors, dags=dags, events_queue=config.events_queue,
                    scheduler_id=scheduler_id, lease=config.event_lease,
                    start_grace=config.start_grace, max_map_length=config.max_map_length)
    broker = brokers.from_url(config.settings.broker_url)
    broker.lease_seconds = config.event_lease
    daemon = Daemon(engine, broker, executors, events_queue=config.events_queue,
                    control_queue=config.control_queue)
    daemon.lease = SchedulerLease(config.settings.stores().state,
                                  scheduler_id, config.event_lease, daemon.waker.at)
    if config.queue_sample_interval:
        daemon.sampler = Sampler(
            config.settings.stores().state,
            lambda: brokers.from_url(config.settings.broker_url),
            config.queue_sample_interval, always=("default", config.events_queue))
    return daemon


def poke(config: SchedulerConfig, run_id: str) -> None:
    """Wake a running scheduler: a run was created and waits to be started."""
    with brokers.from_url(config.settings.broker_url) as broker:
        broker.publish(config.control_queue, json.dumps({"run_id": run_id}).encode())
