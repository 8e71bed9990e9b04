"""Dynamic task mapping (Airflow's `expand`): one task instance per element, made at run time.

A mapped task is queued like any other when its upstreams are done; at that moment, in the
same transaction (the run's row locked), `Mapper.expand` replaces it by its instances: it
reads the lists it maps over (literal, or what its upstream tasks returned), checks them
(`instance_kwargs`), inserts one queued instance per element (task id `name[i]`, its own
attempts, retries, log and result) and moves the mapped task to `running`. The instances are
then published in one batch like any ready tasks. Because the insert and the move commit
together, and the move is guarded by `state = 'queued'`, a scheduler killed before, during or
after it leaves exactly one set of instances (published later by the claim machinery if it
died before publishing them).

When every instance has ended, `Mapper.close` ends the mapped task: success with the list of
the instances' results in element order (what its downstream tasks receive), or failed
naming the instances that failed. A list too long (`max_map_length`, else
CONVEYOR_MAX_MAP_LENGTH) or not a list fails the mapped task; an empty one skips it. Either
way, and when it closes, its children are judged by their trigger rules (`readiness.py`):
an `all_success` child of a skipped mapped task is skipped, an `all_done` one runs. An
instance that skips itself (raises `Skip`) skips the mapped task once all have ended.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conveyor.scheduler.dag import UPSTREAM_REF
from conveyor.scheduler.readiness import Readiness
from conveyor.state.maps import Maps
from conveyor.state.records import TaskInstance, Transition
from conveyor.state.store import Store
from conveyor.state.tasks import Attempts, TaskInstances

#: Most instances one mapped task may create unless it or the scheduler says otherwise.
MAX_MAP_LENGTH = 1024
#: Runs whose having a mapped task or not `Mapper` remembers (then it forgets them all).
RUNS_REMEMBERED = 10_000


class MapError(Exception):
    """Why a mapped task cannot expand: said on the task, which fails."""


def resolved(value: Any, upstream: Mapping[str, Any]) -> Any:
    """A spec argument with an upstream reference replaced by that task's return value
    (also inside a list: a canvas passes a group's results as one)."""
    if isinstance(value, dict) and len(value) == 1 and UPSTREAM_REF in value:
        return upstream.get(value[UPSTREAM_REF])
    if isinstance(value, list):
        return [resolved(each, upstream) for each in value]
    return value


def instance_kwargs(expand: Mapping[str, Any], upstream: Mapping[str, Any],
                    limit: int) -> list[dict[str, Any]]:
    """The mapped keyword arguments of each instance, in element order ([]: nothing to map
    over). Several lists map over their cross product (the first varies slowest, as
    `itertools.product`), or element by element when `expand["zip"]`."""
    names = list(expand["kwargs"])
    lists = [_as_list(name, expand["kwargs"][name], upstream) for name in names]
    if expand.get("zip"):
        lengths = {len(values) for values in lists}
        if len(lengths) > 1:
            sizes = ", ".join(f"{n}: {len(v)}" for n, v in zip(names, lists, strict=True))
            raise MapError(f"expand_zip needs lists of one length, got {sizes}")
        count = lengths.pop()
        combos: Any = zip(*lists, strict=True)
    else:
        count = math.prod(len(values) for values in lists)
        combos = itertools.product(*lists)
    if count > limit:
        raise MapError(f"mapping would create {count} instances, more than max_map_length "
                       f"{limit}: return fewer elements, or raise the task's max_map_length "
                       "(or CONVEYOR_MAX_MAP_LENGTH)")
    return [dict(zip(names, combo, strict=True)) for combo in combos]


def _as_list(name: str, value: Any, upstream: Mapping[str, Any]) -> list[Any]:
    if isinstance(value, dict) and value.get(UPSTREAM_REF, "") not in upstream:
        raise MapError(f"cannot map {name!r}: task {value[UPSTREAM_REF]!r} did not succeed, "
                       "so it returned nothing to map over")
    found = resolved(value, upstream)
    if isinstance(found, list):
        return found
    source = (f"task {value[UPSTREAM_REF]!r} returned" if isinstance(value, dict)
              else "it is")
    raise MapError(f"cannot map {name!r} over {type(found).__name__} {_short(found)}: "
                   f"{source} that, not a list")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def instance_spec(spec: Mapping[str, Any], upstream: Mapping[str, Any], index: int,
                  mapped: Mapping[str, Any]) -> dict[str, Any]:
    """What instance `index` runs: the mapped task's spec with every argument a value (its
    upstreams' results resolved now), its mapped ones added, and nothing below it."""
    instance = {k: v for k, v in spec.items() if k != "expand"}
    instance["args"] = [resolved(a, upstream) for a in spec["args"]]
    instance["kwargs"] = {**{k: resolved(v, upstream) for k, v in spec["kwargs"].items()},
                          **mapped}
    return {**instance, "upstream": [], "downstream": [], "map_index": index}


class Mapper:
    """Expands mapped tasks and closes them; every method runs in the caller's transaction
    with the run's row locked."""

    def __init__(self, store: Store, claim: Callable[[], dict[str, Any]],
                 readiness: Readiness, max_map_length: int = MAX_MAP_LENGTH) -> None:
        self.maps, self.tis, self.attempts = Maps(store), TaskInstances(store), Attempts(store)
        self.claim = claim
        self.readiness = readiness
        self.max_map_length = max_map_length
        #: run id -> whether it has a mapped task: a run without one is never asked again
        #: which of its maps ended (a query on every run's every end of a task otherwise)
        self._has_maps: dict[str, bool] = {}

    def expand(self, ready: Sequence[TaskInstance], now: float) -> list[TaskInstance]:
        """`ready` with each mapped task replaced by its instances (none if it failed or was
        skipped instead)."""
        out: list[TaskInstance] = []
        for ti in ready:
            if "expand" in ti.spec and ti.map_task is None:
                out += self._expand_one(ti, now)
            else:
                out.append(ti)
        return out

    def _expand_one(self, ti: TaskInstance, now: float) -> list[TaskInstance]:
        upstream = self._upstream(ti)
        limit = int(ti.spec["expand"].get("max_length") or self.max_map_length)
        try:
            kwargs = instance_kwargs(ti.spec["expand"], upstream, limit)
        except MapError as exc:
            return self._refuse(ti, "failed", f"MapError: task {ti.task_id!r}: {exc}", now)
        if not kwargs:
            return self._refuse(ti, "skipped", None, now)
        if not self.maps.expanded(ti, len(kwargs), now):
            return []
        claim = self.claim()
        self.maps.insert_instances([
            {"ti_id": f"{ti.ti_id}.{i}", "task_id": f"{ti.task_id}[{i}]", "map_index": i,
             "map_ti_id": ti.ti_id, "now": now, "spec": json.dumps(
                 instance_spec(ti.spec, upstream, i, mapped)), **claim}
            for i, mapped in enumerate(kwargs)])
        return self.maps.instances(ti.run_id, ti.task_id)

    def _refuse(self, ti: TaskInstance, state: str, error: str | None, now: float
                ) -> list[TaskInstance]:
        """End the mapped task unexpanded; what its children's trigger rules then start."""
        if not self.maps.refused(ti, state=state, error=error, now=now):
            return []
        self.attempts.record(Transition(ti.ti_id, ti.attempt, now, now),
                             outcome=state, error=error, result=None, log=None)
        return self._after(ti, now)

    def _after(self, ti: TaskInstance, now: float) -> list[TaskInstance]:
        return self.expand(self.readiness.after(ti.run_id, [ti.task_id], now,
                                                claim=self.claim()), now)

    def _upstream(self, ti: TaskInstance) -> dict[str, Any]:
        found = self.tis.upstream_results(ti.run_id, ti.task_id)
        return {task_id: json.loads(result) if result else None
                for task_id, result in found.items()}

    def _run_has_maps(self, run_id: str) -> bool:
        found = self._has_maps.get(run_id)
        if found is None:
            if len(self._has_maps) >= RUNS_REMEMBERED:
                self._has_maps.clear()
            found = self._has_maps[run_id] = self.maps.run_has_maps(run_id)
        return found

    def close(self, run_id: str, now: float) -> list[TaskInstance]:
        """End the run's mapped tasks whose instances have all ended; the tasks this made
        ready (their downstreams, mapped ones expanded)."""
        ready: list[TaskInstance] = []
        if not self._run_has_maps(run_id):
            return ready
        for ti in self.maps.done(run_id):
            instances = self.maps.instances(run_id, ti.task_id)
            bad = [i for i in instances if i.state not in ("success", "skipped")]
            if bad:
                listed = ", ".join(f"{i.map_index} ({i.state})" for i in bad[:10])
                more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
                error = (f"{len(bad)} of {len(instances)} mapped instances did not succeed: "
                         f"index {listed}{more}")
                if self.maps.closed(ti, state="failed", result=None, error=error, now=now):
                    ready += self._after(ti, now)
                continue
            # an instance that raised Skip skips the mapped task (an all_success child of it
            # is skipped, as in Airflow); a none_failed one gets None for that element
            results = "[" + ",".join(i.result or "null" for i in instances) + "]"
            state = "skipped" if any(i.state == "skipped" for i in instances) else "success"
            if self.maps.closed(ti, state=state, result=results, error=None, now=now):
                ready += self._after(ti, now)
        return ready
