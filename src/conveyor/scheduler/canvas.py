"""A canvas (`conveyor.canvas`: chain, group, chord) run as an ad-hoc scheduler run.

The canvas becomes a DAG built on the fly (no file): one task per signature, edges for the
order, and arguments that stand for upstream results, which the engine fills in when the
task is dispatched (`engine.resolved`). A run is a snapshot of its tasks' specs, so
nothing else needs the canvas again: the run is durable, survives a scheduler restart,
and its tasks are retried like any DAG task's. Its DAG id is `canvas.<name>`, its run type
`canvas`, so `conveyor runs list` and the dashboard show it among the others.

What the run returns (`CanvasHandle.result`) has the canvas's shape: a task's result for
a signature or a chain, the list of its members' for a group (nested as the groups are).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

from conveyor.canvas import Canvas, Signature, chain, chord, group, use_starter
from conveyor.errors import ResultTimeout, TaskFailed
from conveyor.scheduler.dag import DAG, TaskNode
from conveyor.scheduler.errors import RunError
from conveyor.tasks import REGISTRY

#: Where a canvas's value comes from: a task id, or a group's list of them (nested).
Shape: TypeAlias = "str | list[Shape]"
RUN_TYPE = "canvas"
DAG_PREFIX = "canvas."
#: Seconds between looks at the run while `result()` waits.
POLL = 0.05
ENDED = ("success", "failed", "cancelled")
_NOT_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def build(canvas: Canvas, name: str = "") -> tuple[DAG, Shape]:
    """The DAG that runs `canvas`, and where its value will be."""
    dag, shape, _ = plan(canvas, name)
    return dag, shape


def plan(canvas: Canvas, name: str = "") -> tuple[DAG, Shape, list[tuple[str, Signature]]]:
    """`build`, and which task of the DAG runs each signature (the very objects of the
    canvas, in the order they were added): the Celery intake keeps each task's Celery id."""
    dag = DAG(DAG_PREFIX + _slug(name or _default_name(canvas)),
              description="an ad-hoc run of a canvas (chain, group, chord)")
    dag.version = RUN_TYPE
    builder = _Builder(dag)
    shape = builder.add(canvas, None)
    if not dag.tasks:
        raise TypeError("this canvas has no task to run (an empty group?)")
    return dag, shape, builder.made


class _Builder:
    """Adds each step's tasks to the DAG: `add(step, previous)` returns the step's value."""

    def __init__(self, dag: DAG) -> None:
        self.dag = dag
        self.nodes: dict[str, TaskNode] = {}
        self.made: list[tuple[str, Signature]] = []

    def add(self, step: Canvas, previous: Shape | None) -> Shape:
        if isinstance(step, Signature):
            return self._task(step, previous)
        if isinstance(step, chain):
            value = previous
            for each in step.steps:
                value = self.add(each, value)
            assert value is not None
            return value
        if isinstance(step, group):
            return [self.add(member, previous) for member in step.members]
        if isinstance(step, chord):
            return self.add(step.body, self.add(step.header, previous))
        raise TypeError(f"not a canvas element: {step!r}")

    def _task(self, sig: Signature, previous: Shape | None) -> str:
        """One task, after what `previous` names; given its value first unless immutable."""
        first = [] if sig.immutable or previous is None else [self._value(previous)]
        task = REGISTRY.get(sig.task) or sig.task
        node = self.dag.task(task, id=f"{_slug(sig.task.rsplit('.', 1)[-1])[:60]}-"
                                      f"{len(self.nodes)}",
                             args=[*first, *sig.args], kwargs=dict(sig.kwargs),
                             upstream=sorted(set(task_ids(previous))), **sig.options)
        self.nodes[node.id] = node
        self.made.append((node.id, sig))
        return node.id

    def _value(self, shape: Shape) -> Any:
        if isinstance(shape, str):
            return self.nodes[shape]
        return [self._value(each) for each in shape]


def task_ids(shape: Shape | None) -> list[str]:
    """The task ids a value is made of, in order."""
    if shape is None:
        return []
    if isinstance(shape, str):
        return [shape]
    return [task_id for each in shape for task_id in task_ids(each)]


def _default_name(canvas: Canvas) -> str:
    """The last task's name (a group's: its first member's)."""
    if isinstance(canvas, Signature):
        return canvas.task.rsplit(".", 1)[-1]
    if isinstance(canvas, chain):
        return _default_name(canvas.steps[-1])
    if isinstance(canvas, chord):
        return _default_name(canvas.body)
    return _default_name(canvas.members[0]) if canvas.members else "group"


def _slug(text: str) -> str:
    return _NOT_ID.sub("_", text).strip(".-") or "canvas"


def start(canvas: Canvas, *, name: str = "", state_url: str = "", broker_url: str = "",
          executors: Sequence[str] = ()) -> CanvasHandle:
    """Create the canvas's run in the state store and wake the schedulers (see
    `conveyor.canvas`). The run exists once this returns: a scheduler starts it even if the
    wake-up is lost, on its next look at queued runs."""
    from conveyor.scheduler import daemon
    from conveyor.scheduler.config import SchedulerConfig
    from conveyor.state import store as stores

    config = SchedulerConfig.from_env(broker_url=broker_url or None,
                                      state_url=state_url or None,
                                      executors=",".join(executors) or None)
    dag, shape = build(canvas, name)
    dag.validate(config.executors)
    store = stores.from_url(config.settings.state_url)
    try:
        run_id = create(store, dag, time.time(), config.executors)
    finally:
        store.close()
    daemon.poke(config, run_id)
    return CanvasHandle(run_id, dag.dag_id, shape, config.settings.state_url)


def create(store: Any, dag: DAG, now: float, executors: Sequence[str]) -> str:
    """The run's id. Runs are unique per (DAG, logical date): two canvases of one name
    created in the same microsecond take the next free microsecond."""
    from conveyor.scheduler.runs import create_run

    for tries in range(1000):
        run_id = create_run(store, dag, now, executors=executors,
                            logical_date=now + tries * 1e-6, run_type=RUN_TYPE)
        if run_id is not None:
            return run_id
    raise RunError(f"could not create a run of {dag.dag_id}: 1000 runs at the same time")


@dataclass(frozen=True)
class CanvasHandle:
    """A started canvas: its run, and where its value will be."""

    run_id: str
    dag_id: str
    shape: Shape
    state_url: str

    def status(self) -> str:
        """The run's state: queued, running, success, failed or cancelled."""
        with self._store() as store:
            run, _ = self._read(store)
        return run.state if run is not None else "unknown"

    def result(self, timeout: float | None = 10.0) -> Any:
        """The canvas's value once its run succeeded, waiting up to `timeout` seconds
        (None: forever): the last task's result, or a group's list of results.

        Raises `TaskFailed` with the error of the task that failed for good (a chain
        stops there; a chord's callback never runs), and `ResultTimeout` if the run has
        not ended by then."""
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        with self._store() as store:   # one connection for the whole wait
            while True:
                run, tis = self._read(store)
                if run is not None and run.state in ENDED:
                    return self._outcome(run.state, tis)
                if time.monotonic() >= deadline:
                    state = run.state if run is not None else "absent"
                    raise ResultTimeout(
                        f"canvas run {self.run_id} ({self.dag_id}) has not ended after "
                        f"{timeout:g} s (state {state}): is `conveyor scheduler` running, "
                        f"and are workers consuming its tasks' queues? See `conveyor runs "
                        f"show {self.run_id}`")
                time.sleep(POLL)

    @contextmanager
    def _store(self) -> Iterator[Any]:
        from conveyor.state import store as stores

        store = stores.from_url(self.state_url)
        try:
            yield store
        finally:
            store.close()

    def _read(self, store: Any) -> tuple[Any, list[Any]]:
        """The run, and its task instances once it ended."""
        from conveyor.state.runs import Runs
        from conveyor.state.tasks import TaskInstances

        run = Runs(store).get(self.run_id)
        ended = run is not None and run.state in ENDED
        return run, TaskInstances(store).of_run(self.run_id) if ended else []

    def _outcome(self, state: str, tis: Iterable[Any]) -> Any:
        by_id = {ti.task_id: ti for ti in tis}
        if state == "success":
            return _value(self.shape, by_id)
        failed = sorted((ti for ti in by_id.values() if ti.state in ("failed", "cancelled")),
                        key=lambda ti: (ti.ended_at or 0.0, ti.position))
        if not failed:
            raise TaskFailed(f"canvas run {self.run_id} ({self.dag_id}) ended {state}",
                             reason=state)
        raise failure(self.run_id, self.dag_id, failed[0].task_id, failed[0].error or "")

    def __repr__(self) -> str:
        return f"<CanvasHandle {self.dag_id} run {self.run_id}>"


use_starter(start)


def _value(shape: Shape, tis: dict[str, Any]) -> Any:
    import json

    if isinstance(shape, str):
        result = tis[shape].result
        return None if result is None else json.loads(result)
    return [_value(each, tis) for each in shape]


def failure(run_id: str, dag_id: str, task_id: str, error: str) -> TaskFailed:
    """The `TaskFailed` of a canvas whose task `task_id` failed for good with `error`
    (as the engine records it: "failed: Type: message (reason)", then the traceback)."""
    summary, _, traceback = error.partition("\n")
    kind, _, rest = summary.partition(": ")
    error_type, _, message = rest.partition(": ") if rest else ("", "", "")
    return TaskFailed(f"canvas run {run_id} ({dag_id}): task {task_id} failed for good: "
                      f"{summary}", error_type=error_type, error_message=message,
                      remote_traceback=traceback, reason=kind)
