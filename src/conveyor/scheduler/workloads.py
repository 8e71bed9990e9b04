"""The message that runs one attempt of a DAG task instance: what the engine hands its
executors. Kept apart from the engine's state machine (engine.py), which only decides when
an attempt is dispatched; this decides what the worker receives: the task's arguments with
its upstreams' values filled in, the headers that tie its outcome back to the attempt, its
deadline to start."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from conveyor import tracing
from conveyor.flow import LIMITS_HEADER
from conveyor.message import SKIP_CODES_HEADER, Message
from conveyor.scheduler.executors import Workload
from conveyor.scheduler.mapping import resolved
from conveyor.state.records import TaskInstance


def workload(ti: TaskInstance, events_queue: str, upstream: Mapping[str, Any] | None = None, *,
             now: float | None = None, queue: str | None = None) -> Workload:
    """The message that runs this attempt of `ti`, and its executor config; `upstream`
    (what its parents returned) fills TaskFlow arguments and the task's context. Published
    at `now`, it must start within the task's queued_timeout (`Message.expires`): no worker
    starts it later, so the attempt the scheduler times out never runs. `queue`: where a
    run pinned to its code sends it (pinning.py), else the task's own."""
    spec = ti.spec
    ref = _context_headers(ti)
    if upstream:
        ref["upstream"] = json.dumps(upstream)
    if spec.get("limits"):
        ref[LIMITS_HEADER] = spec["limits"]
    if codes := spec.get("skip_on_exit_code"):   # a command task: its exit codes that skip
        ref[SKIP_CODES_HEADER] = ",".join(map(str, codes))
    if tracing.current() is not None:   # the attempt's span, child of the run's: see tracing
        ref[tracing.TRACEPARENT] = tracing.traceparent(
            *tracing.task_instance_ids(ti.run_id, ti.ti_id, ti.attempt))
    values = upstream or {}
    timing: dict[str, Any] = {} if now is None else {
        "enqueued_at": now, "expires": now + ti.queued_timeout}
    message = Message(
        queue=queue or ti.queue, task=spec["task"], command=tuple(spec["command"]),
        args=tuple(resolved(a, values) for a in spec["args"]),
        kwargs={k: resolved(v, values) for k, v in spec["kwargs"].items()},
        priority=ti.priority,
        attempt=ti.attempt, time_limit=spec["time_limit"],
        memory_limit=spec["memory_limit"], max_retries=0, reply_to=events_queue,
        run_id=f"{ti.ti_id}/{ti.attempt}", trace_id=ti.run_id,
        headers={**ref, "settle": "report", "run": ti.run_id, "task_id": ti.task_id},
        **timing)
    return Workload(message, spec.get("executor_config", {}))


def _context_headers(ti: TaskInstance) -> dict[str, str]:
    """The headers the task's context is read from (conveyor/context.py)."""
    spec = ti.spec
    ref = {"ti": ti.ti_id, "attempt": str(ti.attempt)}
    if spec.get("conf"):
        ref["conf"] = json.dumps(spec["conf"])
    if spec.get("dag_id"):
        ref["dag"] = spec["dag_id"]
    if "map_index" in spec:
        ref["map_index"] = str(spec["map_index"])
    if spec.get("asset_events"):   # the asset events that started the run
        ref["asset_events"] = json.dumps(spec["asset_events"])
    if ti.trigger_event is not None:   # resumed from a deferral: what its trigger fired with
        ref["trigger_event"] = ti.trigger_event
    if spec.get("logical_date"):
        ref["logical_date"] = spec["logical_date"]
    return ref
