"""Mapped tasks (`expand`) and their instances: the writes that expand and close a map.

A mapped task keeps one row, its summary: queued like any task when its upstreams are done,
then `running` once its instances exist (`map_count` of them, each a row with `map_task`
and `map_index`), then success or failed once they have all ended. Each write is guarded by
the state it leaves, and the caller holds the run's lock (see `scheduler/mapping.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.state.records import TaskInstance
from conveyor.state.store import Repository


class Maps(Repository):
    """The expansion of mapped tasks and the end of their instances."""

    def insert_instances(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Instances of one mapped task, queued and claimed, in one round trip."""
        self.store.exec_many("insert_map_instance", rows)

    def expanded(self, ti: TaskInstance, count: int, now: float) -> bool:
        """The mapped task running over its `count` instances; False if it was not queued
        in this attempt any more (then nothing may be inserted: the caller rolls back)."""
        return bool(self.store.exec("map_expanded", ti_id=ti.ti_id, attempt=ti.attempt,
                                    count=count, now=now))

    def refused(self, ti: TaskInstance, *, state: str, error: str | None, now: float) -> bool:
        """The mapped task `failed` (cannot expand) or `skipped` (nothing to map over)."""
        return bool(self.store.exec("map_refused", ti_id=ti.ti_id, attempt=ti.attempt,
                                    state=state, error=error, now=now))

    def run_has_maps(self, run_id: str) -> bool:
        """Whether the run has a mapped task (never changes: a run is a snapshot)."""
        return self.store.one("run_has_maps", run_id=run_id) is not None

    def instances(self, run_id: str, task_id: str) -> list[TaskInstance]:
        """A mapped task's instances, by map index."""
        return [TaskInstance.from_row(row) for row in self.store.rows(
            "map_instances", run_id=run_id, task_id=task_id)]

    def done(self, run_id: str) -> list[TaskInstance]:
        """The run's mapped tasks still running whose instances have all ended."""
        return [TaskInstance.from_row(row) for row in self.store.rows("maps_done",
                                                                      run_id=run_id)]

    def closed(self, ti: TaskInstance, *, state: str, result: str | None, error: str | None,
               now: float) -> bool:
        return bool(self.store.exec("map_closed", ti_id=ti.ti_id, state=state, result=result,
                                    error=error, now=now))

    def reopened(self, run_id: str, task_id: str) -> None:
        """A finished mapped task running again (one of its instances was cleared/marked)."""
        self.store.exec("map_reopened", run_id=run_id, task_id=task_id)

    def forget(self, run_id: str, task_id: str) -> None:
        """A mapped task cleared as a whole: its instances deleted, expanded again later."""
        self.store.exec("forget_map_instances", run_id=run_id, task_id=task_id)
        self.store.exec("map_unexpanded", run_id=run_id, task_id=task_id)
