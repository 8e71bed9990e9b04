"""Flow-control keys as the dashboard shows them, and why a queued task instance waits.

The limiter's `usage` has each key's limit, tokens in use, messages waiting and denials, and
the message ids holding its tokens; the worker registry says which runner slot runs each
message (its heartbeat's `runners.slots[].id`), so a holder reads as "task on host:pid".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.flow import decode
from conveyor.limits import Usage
from conveyor.scheduler.pinning import waiting_reason

#: A queued task instance waiting longer than this with no publication means no scheduler
#: is publishing it (a tick is at most a second or two away while one runs).
UNPUBLISHED_AFTER = 30.0


def running_messages(workers: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Message id -> where it runs (worker, host, pid, slot, task, seconds), from the live
    workers' last heartbeats."""
    found: dict[str, dict[str, Any]] = {}
    for w in workers:
        if w["stale"] or not w.get("runners"):
            continue
        for slot in w["runners"].get("slots", []):
            if slot.get("id"):
                found[slot["id"]] = {"worker": w["worker"], "host": w["host"], "pid": w["pid"],
                                     "slot": slot["slot"], "task": slot.get("task"),
                                     "seconds": slot.get("seconds")}
    return found


def limit_rows(usage: Sequence[Usage], workers: Sequence[Mapping[str, Any]]
               ) -> list[dict[str, Any]]:
    """One JSON-ready row per key: its limit, use, waiting, denials, whether it is full, and
    each holder with where it runs (only its id when no registered worker reports it)."""
    where = running_messages(workers)
    return [{"key": u.key, "limit": u.limit, "max": u.max, "per_second": u.per_second,
             "burst": u.burst, "overridden": u.overridden, "in_use": u.in_use,
             "waiting": u.waiting, "denied": u.denied,
             "full": u.max is not None and u.in_use >= u.max,
             "holders": [{"id": h, **where.get(h, {})} for h in u.holders]}
            for u in usage]


def limit_keys(ti: Mapping[str, Any]) -> list[str]:
    """The concurrency keys (pools too) a task instance's spec declares, resolved."""
    spec = ti["spec"] if isinstance(ti["spec"], dict) else json.loads(ti["spec"])
    text = spec.get("limits") or ""
    return [s.key for s in decode(text) if s.kind == "c"] if text else []


def why_queued(ti: Mapping[str, Any], now: float, consumers: Mapping[str, Sequence[Any]],
               usage: Mapping[str, Usage] | None, schedulers: int | None = None
               ) -> list[dict[str, str]]:
    """Why a queued task instance has not started, as far as the state store, the worker
    registry and the limiter say: each reason a {"reason", "text"} (empty: nothing known
    holds it back). `usage`: the limiter's keys, or None when it could not be read;
    `schedulers`: how many hold a live lease (None: not known; 0 says so of a published
    task too, whose start or outcome no scheduler applies then)."""
    if ti["state"] != "queued":
        return []
    found = []
    if ti.get("published_at") is None and ti.get("waiting_for"):
        found.append({"reason": "code_version", "text": (
            f"{waiting_reason(ti['waiting_for'])}: its run is pinned to the code its first "
            "task ran; it moves on when one is alive, or as the DAG's pin_policy says after "
            "its pin_timeout")})
    elif ti.get("published_at") is None and now - (ti.get("queued_at") or now) > UNPUBLISHED_AFTER:
        found.append({"reason": "unpublished", "text": _unpublished(schedulers)})
    if not consumers.get(ti["queue"]):
        found.append({"reason": "no_consumer", "text": (
            f"no worker consumes queue `{ti['queue']}`: start one with `conveyor worker "
            f"--queues {ti['queue']}` (only workers given a state store are seen here)")})
    for key in limit_keys(ti):
        u = (usage or {}).get(key)
        if u is not None and u.max is not None and (u.in_use >= u.max or u.waiting):
            found.append({"reason": "limit", "key": key, "text": (
                f"waiting for limit `{key}` ({u.in_use} of {u.max} in use, {u.waiting} "
                "waiting)")})
    if schedulers == 0 and ti.get("published_at") is not None:
        found.append({"reason": "no_scheduler", "text": NO_SCHEDULER})
    return found


#: A published task with no scheduler: a worker may have started or even finished it, but
#: only a scheduler applies what workers report (they wait on its events queue meanwhile).
NO_SCHEDULER = ("no scheduler is running against this state store (none holds a lease): what "
                "workers report (started, succeeded, failed) waits on its events queue and "
                "this state stays as it is until one runs: start `conveyor scheduler`")


def _unpublished(schedulers: int | None) -> str:
    if schedulers == 0:
        return ("not yet published to the broker: no scheduler is running against this state "
                "store (none holds a lease): start one with `conveyor scheduler`")
    if schedulers:
        return (f"not yet published to the broker for over {UNPUBLISHED_AFTER:.0f} s although "
                f"{schedulers} scheduler(s) run: see their log (an executor refusing it, a "
                "broker unreachable)")
    return ("not yet published to the broker: is a scheduler running against this state "
            "store? (`conveyor scheduler`)")
