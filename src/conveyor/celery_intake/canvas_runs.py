"""Celery canvases started as scheduler runs, as `chain(...).enqueue()` starts one.

The feed does not run a canvas message: it puts it, as taken, on `names.CANVAS_QUEUE`
(`feed.publication`), and the outcome loop hands it here (`CanvasRuns.start`):

* a chain (its first task's message, the rest in its embed, nested groups and chords
  included) becomes a run at once (`canvas_plan.chain_plan`);
* a chord arrives as one message per member of its group: each is kept in a Redis hash
  beside Celery's results (one field per member, so a redelivered one counts once), and the
  message that completes the group (its size is what the producer wrote,
  `celery-taskset-meta-<group>.s`) makes the run (`canvas_plan.chord_plan`).

The run is created once however often its message is delivered: its logical date is taken
once per canvas (SET NX of the canvas's key: the first task's Celery id, or the group id),
and a run of that DAG and date is unique; a second try finds the run it made (its conf
names the canvas). Then the run is watched (`run_results.RunResults`), the scheduler is
woken, and only then is the message acked: a crash at any point does it again, and the
again finds what was done.

Celery's `revoke(id)` of a task of a canvas run (`revoke`) cancels that task of the run
(`conveyor tasks cancel`): what follows it never runs and the producer's `get()` raises
TaskRevokedError; one already running goes on unless `terminate=True`, as in Celery.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import redis

from conveyor.celery_intake.canvas import join
from conveyor.celery_intake.canvas_embed import CanvasRefused
from conveyor.celery_intake.canvas_plan import plan_of
from conveyor.celery_intake.conversion import CeleryMessage, arguments
from conveyor.celery_intake.results import RedisResults
from conveyor.celery_intake.run_results import RunResults, watch_record
from conveyor.scheduler.cancel import cancel_task
from conveyor.scheduler.canvas import RUN_TYPE, plan
from conveyor.scheduler.runs import create_run
from conveyor.state.runs import Runs
from conveyor.state.store import Store
from conveyor.state.tasks import TaskInstances

log = logging.getLogger("conveyor.celery_intake")

#: Seconds the keys of a canvas are kept: Celery's default `result_expires`, one day.
KEPT = 86400
#: Under the state store's prefix (run_results.prefix): a canvas's logical date, a chord's
#: members kept so far.
START_KEY = "start:{key}"
MEMBERS_KEY = "members:{group}"
#: A task of a canvas run by its Celery id: [run id, task id], for Celery's revoke.
TASK_KEY = "task:{celery_id}"


class CanvasRuns:
    """Starts the runs of Celery canvases (see the module docstring)."""

    def __init__(self, backend: RedisResults, open_store: Callable[[], Store],
                 watcher: RunResults, wake: Callable[[str], None],
                 executors: Sequence[str] = ("queue",),
                 cancel: Callable[[str], object] = lambda ref: None) -> None:
        """`open_store`: the scheduler's state store (CONVEYOR_STATE_URL), opened on first
        use; `wake(run_id)`: tells the schedulers a run waits (their control queue);
        `cancel`: `Client.cancel`, which stops an attempt a worker holds."""
        self.backend = backend
        self.cancel = cancel
        self._open_store = open_store
        self._store: Store | None = None
        self.watcher = watcher
        self.wake = wake
        self.executors = tuple(executors)

    def start(self, raw: CeleryMessage) -> str | None:
        """Create (or find) the run `raw` completes; its id, None while a chord waits for
        more members. Raises CanvasRefused for what cannot run."""
        args, kwargs, embed = arguments(raw)
        found = plan_of(raw.task_name, raw.task_id, raw.queue, raw.headers, args, kwargs, embed,
                        lambda group_id, index, member: self.backend.call(
                            lambda client: join(client, self.watcher.prefix + MEMBERS_KEY.format(
                                group=group_id), group_id, index, json.dumps(member))))
        if found is None:
            return None
        made, key = found
        assert made.canvas is not None
        dag, _shape, nodes = plan(made.canvas)
        dag.validate(self.executors)
        run_id = self._create(dag, key)
        record = watch_record(made, nodes)
        self.watcher.watch(run_id, record)
        self.backend.call(partial(_index, self.watcher.prefix, run_id, record["ids"]))
        self.wake(run_id)
        log.info("Celery canvas %s is run %s (%s, %d tasks)", key, run_id, dag.dag_id,
                 len(dag.tasks))
        return run_id

    def _create(self, dag: Any, key: str) -> str:
        """The run of canvas `key`: created, or found if an earlier delivery created it."""
        start = self.watcher.prefix + START_KEY.format(key=key)

        def first_date(client: redis.Redis) -> float:
            client.set(start, repr(time.time()), nx=True, ex=KEPT)
            return float(client.get(start))  # type: ignore[arg-type]
        base = self.backend.call(first_date)
        store = self.store()
        for tries in range(1000):
            date = base + tries * 1e-6
            run_id = create_run(store, dag, time.time(), executors=self.executors,
                                conf={"celery": key}, logical_date=date, run_type=RUN_TYPE)
            if run_id is not None:
                return run_id
            existing = Runs(store).by_date(dag.dag_id, date)
            if existing is not None and json.loads(existing.conf or "{}").get("celery") == key:
                return existing.run_id
        raise CanvasRefused(f"could not create a run of {dag.dag_id}: 1000 runs at the same "
                            "time")

    def revoke(self, celery_id: str, terminate: bool) -> bool:
        """Celery's revoke of `celery_id`, if it is a task of a canvas run (True: it was,
        and is cancelled unless it runs and `terminate` is False)."""
        found = self.backend.call(
            lambda client: client.get(self.watcher.prefix + TASK_KEY.format(celery_id=celery_id)))
        if found is None:
            return False
        run_id, task_id = json.loads(found)
        store = self._open_store()   # the revokes thread's own connection
        try:
            ti = TaskInstances(store).by_task(run_id, task_id)
            if ti is not None and ti.state == "running" and not terminate:
                log.info("Celery revoke of %s: task %s of run %s is running and goes on "
                         "(terminate=True stops it)", celery_id, task_id, run_id)
                return True
            outcome = cancel_task(store, run_id, task_id, time.time(), self.cancel)
        finally:
            store.close()
        log.info("Celery revoke of %s: %s", celery_id, outcome.describe(
            f"{task_id} in run {run_id}"))
        return True

    def store(self) -> Store:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _index(prefix: str, run_id: str, ids: Mapping[str, str], client: redis.Redis) -> None:
    """Each task of the run under its Celery id, for a day (Celery's revoke finds it)."""
    with client.pipeline(transaction=False) as pipe:
        for task_id, celery_id in ids.items():
            pipe.set(prefix + TASK_KEY.format(celery_id=celery_id),
                     json.dumps([run_id, task_id]), ex=KEPT)
        pipe.execute()


def task_ids(value: Any) -> list[str]:
    """Every Celery task id a message or signature names (its options' `task_id`s): the
    AsyncResults a producer may hold of a canvas the intake refuses."""
    found: list[str] = []
    if isinstance(value, Mapping):
        options = value.get("options")
        if isinstance(options, Mapping) and isinstance(options.get("task_id"), str):
            found.append(options["task_id"])
        for each in value.values():
            found += task_ids(each)
    elif isinstance(value, list):
        for each in value:
            found += task_ids(each)
    return found


def raw_of(record: Mapping[str, Any]) -> CeleryMessage:
    """The Celery message a canvas (or rejection) record carries (`feed.record`)."""
    return CeleryMessage(queue=str(record["celery_queue"]),
                         content_type=str(record["content_type"]),
                         content_encoding=str(record["content_encoding"]),
                         headers=record["headers"],
                         body=base64.b64decode(record["body_base64"]))
