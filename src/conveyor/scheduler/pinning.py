"""Runs pinned to their code: which queue a pinned run's task is published to, or why not.

A worker announces its code version and serves `<queue>@<version>` beside each of its
queues (worker/code_version.py). A run records the version of the worker its first task
started on (a task without upstreams is always the first to start: `started`). A task of a
pinned run (`DAG(pin_code=True)`, `dags trigger --pin-code`; its spec's `pin`) is then
published to `<queue>@<version>`, which only workers of that version consume, while the
worker registry has a live one of them serving its queue.

When none is alive the task is *held*: queued, claimed and unpublished, `waiting_for`
naming the version, looked at again every RECHECK seconds through the claim path an
unpublished attempt already has (`claim_unpublished`). Never published means never run,
so the hold adds no copy; the publish is recorded as any other (at least once). Once it
has waited `pin_timeout` seconds since it was queued, policy `newest` publishes it to its
own queue, where any worker (the newest) takes it; `wait` keeps waiting.

A message already in `<queue>@<version>` when its last worker of that version goes away
is *stranded*: no worker may take it, and on RabbitMQ its queue expires once unused
(`x-expires`, broker/rabbitmq/ladder.py). At its deadline to start (queued_timeout + the
start grace), when the message is past its `expires` and no worker will run it any more,
the scheduler sends it again (`stranded`): the next attempt, not charged to the task's
retries, routed here afresh (held, or moved on by the policy). A version's worker that
comes back meanwhile runs it; one that comes back later acks it unrun (an old attempt).
One that was running is its heartbeat timeout's, as for any lost worker. Pinning applies
to the queue executor (the local and Kubernetes executors choose no worker).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.events import Event
from conveyor.state.monitoring import Workers
from conveyor.state.records import TaskInstance
from conveyor.state.runs import Runs
from conveyor.state.store import Store
from conveyor.state.tasks import TaskInstances

log = logging.getLogger("conveyor.scheduler")

POLICIES = ("wait", "newest")
#: Seconds between looks at the registry for a held task: a worker appears on its first
#: heartbeat, so this is about what a held task waits beyond that.
RECHECK = 2.0


@dataclass(frozen=True)
class Held:
    """A pinned task kept unpublished: no live worker of `version` serves its queue."""

    ti: TaskInstance
    version: str
    recheck_at: float


def holding_tis(held: Sequence[Held]) -> list[TaskInstance]:
    return [h.ti for h in held]


def pin_spec(timeout: float, policy: str) -> dict[str, Any]:
    """What a pinned run's task specs carry (a snapshot, like the rest of the spec)."""
    return {"timeout": timeout, "policy": policy}


class Pins:
    """Routes a batch of tasks about to be published; see the module docstring."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def started(self, ti: TaskInstance, event: Event) -> None:
        """Record the run's code version from its first task's `started` (later ones and
        tasks with upstreams change nothing, and cost no query)."""
        if event.code_version and not ti.spec.get("upstream"):
            Runs(self.store).set_code_version(ti.run_id, event.code_version)

    def route(self, tis: Sequence[TaskInstance], now: float
              ) -> tuple[dict[str, str], list[Held]]:
        """The code version each pinned task is sent to, `<queue>@<it>` (by ti id; absent:
        its own queue), and those held. No query for a batch without a pinned task (the
        common case)."""
        pinned = [ti for ti in tis if ti.spec.get("pin") and ti.executor == "queue"]
        if not pinned:
            return {}, []
        versions = Runs(self.store).code_versions(list({ti.run_id for ti in pinned}))
        live = Workers(self.store).live_versions(now) if any(versions.values()) else {}
        routes: dict[str, str] = {}
        held: list[Held] = []
        for ti in pinned:
            version = versions.get(ti.run_id)
            if not version:
                continue           # no task of its run started yet: nothing to pin it to
            if ti.queue in live.get(version, ()):
                routes[ti.ti_id] = version
            elif (waited := now - (ti.queued_at or now)) >= ti.spec["pin"]["timeout"] and \
                    ti.spec["pin"]["policy"] == "newest":
                log.warning("task %s of run %s: no worker of code version %s for %.0f s: "
                            "published to %s for any worker (pin_policy newest)",
                            ti.task_id, ti.run_id, version, waited, ti.queue)
            else:
                if ti.waiting_for != version:   # said once per hold, not every recheck
                    log.info("task %s of run %s waits for a worker of code version %s on "
                             "queue %s (its run is pinned to its code)", ti.task_id,
                             ti.run_id, version, ti.queue)
                held.append(Held(ti, version, now + RECHECK))
        return routes, held

    def stranded(self, ti: TaskInstance, now: float) -> str:
        """The version a published attempt was sent to when no live worker of it serves its
        queue any more ('': not sent to a version's queue, or one still serves it)."""
        version = ti.waiting_for or ""
        if not version or ti.published_at is None or ti.state != "queued":
            return ""
        live = Workers(self.store).live_versions(now)
        return "" if ti.queue in live.get(version, ()) else version

    def hold(self, held: Sequence[Held]) -> None:
        """Record the holds (in the caller's transaction, the runs locked)."""
        TaskInstances(self.store).hold([(h.ti, h.version, h.recheck_at) for h in held])


def waiting_reason(version: str | None) -> str:
    """What the dashboard and `runs show` say of a held task."""
    return f"waiting for a worker of code version {version}" if version else ""
