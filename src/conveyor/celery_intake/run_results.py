"""Results of a Celery canvas's run, written to Celery's result backend as its tasks end.

A canvas run's tasks report to the scheduler, like any DAG task's; the producer waits on
Celery's backend. So the intake that started the run watches it, as `handle.result()`
does for the Python canvas: it reads its runs' task instances every `POLL` seconds (two
queries for all its runs) and writes each ended one's document under the task's Celery
id: SUCCESS with its result, FAILURE with its error once it failed for good (retries are
the scheduler's), REVOKED if cancelled. A step that never ran because one before it
failed stays PENDING, as with Celery, except a chord's callback, which fails with Celery's
ChordError naming the member.

Watches are kept in a Redis hash beside Celery's results (run id -> task ids, owner; under
the state store's `prefix`), so they outlive the intake: each intake renews a key of its
own every `LEASE / 3` seconds, and adopts the watches of an owner whose key lapsed
(killed). A run's documents may be written twice then (same content: a SET and a
PUBLISH); none is lost. A watch ends with its run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from conveyor.canvas import Signature
from conveyor.celery_intake.canvas import chord_error
from conveyor.celery_intake.canvas_plan import Plan
from conveyor.celery_intake.results import RedisResults, exception, meta, rejected
from conveyor.message import new_id
from conveyor.scheduler.canvas import ENDED, failure
from conveyor.state.records import TaskInstance
from conveyor.state.runs import Runs
from conveyor.state.store import Store
from conveyor.state.tasks import TaskInstances

log = logging.getLogger("conveyor.celery_intake")

#: Every key of canvas runs is under the prefix of its state store (`prefix`): two
#: deployments sharing a Celery result backend never take each other's watches or runs.
PREFIX = "conveyor-celery-canvas:{store}:"
RUNS_KEY = "runs"
OWNER_KEY = "owner:{token}"
#: Seconds between looks at the watched runs.
POLL = 0.2
#: Seconds an intake's ownership of its watches lasts unless renewed (every LEASE / 3).
LEASE = 6.0


def prefix(state_url: str) -> str:
    """The prefix of the keys of canvas runs in the state store at `state_url`."""
    return PREFIX.format(store=hashlib.sha256(state_url.encode()).hexdigest()[:16])


def watch_record(plan: Plan, nodes: Sequence[tuple[str, Signature]]) -> dict[str, Any]:
    """What to watch of a run made from `plan`: each task's Celery id, each chord's."""
    by_object = {id(sig): node_id for node_id, sig in nodes}
    return {"ids": {node_id: plan.ids[id(sig)] for node_id, sig in nodes},
            "chords": [{"callback": c.callback, "first": by_object[c.first]}
                       for c in plan.chords]}


@dataclass
class _Watch:
    record: Mapping[str, Any]
    written: set[str] = field(default_factory=set)


class RunResults:
    """The watcher thread (see the module docstring); `watch` is called from others."""

    def __init__(self, backend: RedisResults, open_store: Callable[[], Store], prefix: str,
                 stop: threading.Event, poll: float = POLL, lease: float = LEASE) -> None:
        """`prefix`: of this state store's keys (`prefix(state_url)`)."""
        self.backend = backend
        self.prefix = prefix
        self.runs_key = prefix + RUNS_KEY
        self._open_store = open_store
        self.stop = stop
        self.poll = poll
        self.lease = lease
        self.token = new_id()
        self._owned: dict[str, _Watch] = {}
        self._lock = threading.Lock()
        self._next_renew = 0.0

    def watch(self, run_id: str, record: Mapping[str, Any]) -> None:
        """Watch `run_id` from now on (kept in Redis first: it outlives this process)."""
        value = json.dumps({**record, "owner": self.token})
        self.backend.call(lambda client: client.hset(self.runs_key, run_id, value))
        with self._lock:
            self._owned.setdefault(run_id, _Watch(record))

    def run(self) -> None:
        store = self._open_store()   # this thread's own connection (SQLite's are per thread)
        try:
            while not self.stop.wait(self.poll):
                self.turn(store, time.monotonic())
        finally:
            store.close()

    def turn(self, store: Store, now: float) -> None:
        """Renew and adopt when due, then write what ended since the last turn."""
        if now >= self._next_renew:
            self._next_renew = now + self.lease / 3
            self._renew_and_adopt()
        with self._lock:
            owned = dict(self._owned)
        if not owned:
            return
        runs = Runs(store).many(list(owned))
        tis: dict[str, dict[str, TaskInstance]] = {}
        for ti in TaskInstances(store).of_runs(list(runs)):
            tis.setdefault(ti.run_id, {})[ti.task_id] = ti
        for run_id, watch in owned.items():
            run = runs.get(run_id)
            if run is None or self._look(run.state, tis.get(run_id, {}), watch):
                self.backend.call(partial(_forget, self.runs_key, run_id))
                with self._lock:
                    self._owned.pop(run_id, None)

    def _renew_and_adopt(self) -> None:
        """Keep this intake's key alive; take the watches of owners whose key lapsed."""
        def work(client: Any) -> list[tuple[str, dict[str, Any]]]:
            owner = self.prefix + OWNER_KEY
            client.set(owner.format(token=self.token), "1", px=int(self.lease * 1000))
            watches = {k.decode(): json.loads(v)
                       for k, v in client.hgetall(self.runs_key).items()}
            owners = sorted({w.get("owner", "") for w in watches.values()} - {self.token})
            alive = {o for o in owners if client.exists(owner.format(token=o))}
            orphans = [(r, w) for r, w in watches.items()
                       if w.get("owner") != self.token and w.get("owner") not in alive]
            for run_id, w in orphans:
                client.hset(self.runs_key, run_id, json.dumps({**w, "owner": self.token}))
            return orphans
        for run_id, record in self.backend.call(work):
            log.info("Celery canvas run %s: its watcher is gone, this intake writes its "
                     "results now", run_id)
            with self._lock:
                self._owned.setdefault(run_id, _Watch(record))

    def _look(self, state: str, tis: Mapping[str, TaskInstance], watch: _Watch) -> bool:
        """Write the documents of the run's tasks that ended; True once the run (in
        `state`) ended."""
        ids: Mapping[str, str] = watch.record["ids"]
        for task_id, ti in tis.items():
            if task_id in watch.written or task_id not in ids:
                continue
            document = _document(ids[task_id], ti)
            if document is not None:
                self.backend.store(document)
                watch.written.add(task_id)
        if state not in ENDED:
            return False
        for chord in watch.record.get("chords", []):
            first = tis.get(chord["first"])
            if first is not None and first.state not in ("success", "failed", "cancelled"):
                self.backend.store(_chord_failed(chord["callback"], tis.values(), ids))
        return True


def _forget(runs_key: str, run_id: str, client: Any) -> None:
    client.hdel(runs_key, run_id)


def _document(celery_id: str, ti: TaskInstance) -> dict[str, Any] | None:
    """Celery's document of a task instance that ended, None if it has not (or never ran)."""
    if ti.state == "success":
        return meta(celery_id, "SUCCESS", json.loads(ti.result) if ti.result else None)
    if ti.state == "failed":
        error = failure(ti.run_id, "", ti.task_id, ti.error or "")
        return meta(celery_id, "FAILURE", exception(error.error_type or "TaskFailed",
                                                    error.error_message or str(error)),
                    error.remote_traceback or None)
    if ti.state == "cancelled":
        return rejected(celery_id, "REVOKED", f"cancelled: {ti.error or ''}")
    return None


def _chord_failed(callback: str, tis: Any, ids: Mapping[str, str]) -> dict[str, Any]:
    """The callback's ChordError, naming the first member that failed for good."""
    failed = sorted((ti for ti in tis if ti.state == "failed"),
                    key=lambda ti: (ti.ended_at or 0.0, ti.position))
    if not failed:
        return meta(callback, "FAILURE", exception("ChordError", "the chord's run ended "
                                                   "without running it", "celery.exceptions"))
    culprit = _document(ids.get(failed[0].task_id, failed[0].task_id), failed[0]) or {}
    return chord_error(callback, {"id": ids.get(failed[0].task_id, ""),
                                  "result": culprit.get("result")})
