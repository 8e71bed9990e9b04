"""Runs started by assets and events: recording a task's outlets, and turning the events
queued for a DAG into its run, exactly once.

Recording (`Engine._produced`): a task's success records an event for each of its `outlets`
in the transaction of the success itself (`assets touch` / `events send` in one of their
own: `state.assets.record_event`);
the same statement queues it for every DAG consuming its URI (state/assets.py). So an event
exists exactly when its cause committed, and is queued for its consumers from that moment.

Consuming (`AssetRuns.tick`): for each DAG whose condition holds over its queued events, one
transaction creates the run (the events in its context) and deletes the queued rows it read,
the delete guarded by their count: a second scheduler that read the same rows deletes none
and rolls back its run; a scheduler killed before the commit leaves both undone, for the next
tick of any scheduler. An events-only DAG (`Event`, or `|` of events) gets a run per event,
the payload as its conf; another gets one run for all its queued events (Airflow's rule).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conveyor.scheduler.assets import EVENT_PREFIX
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.runs import create_run
from conveyor.state.assets import AssetEvent, Assets
from conveyor.state.records import TaskInstance
from conveyor.state.store import Store

log = logging.getLogger("conveyor.scheduler.assets")

#: Most queued events read per tick (the rest wait for the next one).
BATCH = 1000
#: Apart between the logical dates of runs one tick creates for one DAG (unique per DAG).
STEP = 1e-6


class _Taken(Exception):
    """Another scheduler consumed these events first (or the run's date was taken)."""


def outlets_of(spec: Mapping[str, Any], result: Any, given: Mapping[str, Any] | None = None
               ) -> list[tuple[str, dict[str, Any]]]:
    """(URI, extra) per outlet of a task that returned `result`: a returned JSON object is
    each outlet's event's extra, with what the task set for that URI through its context
    (`given`, by URI: `context.set_asset_extra`) over it."""
    extra = dict(result) if isinstance(result, dict) else {}
    given = given or {}
    return [(uri, {**extra, **(given.get(uri) or {})}) for uri in spec.get("outlets") or ()]


class AssetRuns:
    """Creates the runs of asset- and event-scheduled DAGs from their queued events."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.assets = Assets(store)
        #: Called with a DAG's queued events before its run is created (tests: a crash
        #: with the events recorded and no run), and with the new run's id before its
        #: events are consumed, in the same transaction (a crash in between).
        self.before_run: Callable[[Sequence[AssetEvent]], None] = lambda events: None
        self.before_consume: Callable[[str], None] = lambda run_id: None
        self.runs_created = 0

    def produced(self, ti: TaskInstance, result: Any, given: Mapping[str, Any] | None,
                 now: float) -> None:
        """Record an asset event per outlet of a task that succeeded, in the caller's
        transaction (its success's): the event commits with the success, or neither does."""
        for uri, extra in outlets_of(ti.spec, result, given):
            self.assets.record(uri, extra, now, source="task", dag_id=ti.spec.get("dag_id"),
                               run_id=ti.run_id, task_id=ti.task_id)

    def tick(self, dags: Mapping[str, DAG], executors: Sequence[str], now: float) -> int:
        """Create the runs whose conditions hold; how many. No query at all while no DAG
        loaded here is scheduled on assets (a cron-only scheduler's every tick)."""
        if not any(dag.assets is not None for dag in dags.values()):
            return 0
        made = 0
        for dag_id, events in self.assets.queued(BATCH).items():
            dag = dags.get(dag_id)
            if dag is None or dag.assets is None:
                continue   # not loaded here (another scheduler's folder): its events wait
            if dag.assets.events_only():
                batches = [[event] for event in events]
            elif dag.assets.met({event.uri for event in events}):
                batches = [list(events)]
            else:
                continue
            for index, batch in enumerate(batches):
                made += self._start(dag, batch, executors, now + index * STEP)
        self.runs_created += made
        return made

    def _start(self, dag: DAG, batch: Sequence[AssetEvent], executors: Sequence[str],
               date: float) -> int:
        """One run of `dag` for `batch`, and the batch consumed, or neither."""
        self.before_run(batch)
        events_only = dag.assets is not None and dag.assets.events_only()
        try:
            with self.store.transaction():
                run_id = create_run(self.store, dag, date, executors=executors,
                                    conf=payload(batch), logical_date=date,
                                    run_type="event" if events_only else "asset",
                                    triggered_by=[event.doc() for event in batch])
                if run_id is None:
                    raise _Taken
                self.before_consume(run_id)
                taken = self.assets.consume(dag.dag_id, batch[0].event_id, batch[-1].event_id)
                if taken != len(batch):
                    raise _Taken
        except _Taken:
            log.info("events %d-%d of DAG %s were taken by another scheduler (or changed "
                     "meanwhile): left to it", batch[0].event_id, batch[-1].event_id,
                     dag.dag_id)
            return 0
        log.info("run %s of %s started by %s", run_id, dag.dag_id,
                 ", ".join(sorted({event.uri for event in batch})))
        return 1


def payload(batch: Sequence[AssetEvent]) -> dict[str, Any]:
    """A run's conf: the payloads of the named events that started it (later ones win);
    assets' extras are in its context, not its conf."""
    conf: dict[str, Any] = {}
    for event in batch:
        if event.uri.startswith(EVENT_PREFIX):
            conf.update(event.extra)
    return conf

