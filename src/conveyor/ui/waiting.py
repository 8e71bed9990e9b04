"""Why a queued task instance waits, for the run and task pages: how long it has been
queued, and what holds it back (nothing publishes it, no worker consumes its queue, a full
limit), from the state store, the worker registry and the limiter (`readers.limits`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from conveyor.errors import BrokerError
from conveyor.readers.limits import NO_SCHEDULER, limit_keys, why_queued
from conveyor.readers.queue_history import consumers, live_schedulers
from conveyor.ui.html import age, ago, e, when
from conveyor.ui.http import HttpError

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard

Reasons = dict[str, list[dict[str, str]]]


#: A running task instance with no heartbeat recorded for this long says so (a worker
#: beats every 10 s by default; the scheduler records each beat it applies).
SILENT_AFTER = 120.0


def reasons(ui: Dashboard, tis: Sequence[dict[str, Any]]) -> Reasons:
    """Task id -> why it waits, for the queued ones, and what holds back a running one
    (no scheduler to apply its outcome, no heartbeat for long); one registry read; the
    limiter is read only when a queued task declares a limit, and an unreachable one is
    left out."""
    queued = [t for t in tis if t["state"] == "queued"]
    running = [t for t in tis if t["state"] == "running"]
    if not queued and not running:
        return {}
    now = time.time()
    with ui.store() as store:
        listening = consumers(store, now, ui.scheduler_queues())
        schedulers = len(live_schedulers(store, now))
    usage = None
    if any(limit_keys(t) for t in queued):
        try:
            with ui.limiter() as limiter:
                usage = {u.key: u for u in limiter.usage(now)}
        except (HttpError, BrokerError):   # unreachable: the other reasons still hold
            usage = None
    found = {t["task_id"]: why_queued(t, now, listening, usage, schedulers) for t in queued}
    found.update({t["task_id"]: why_running(t, now, schedulers) for t in running})
    return found


def why_running(ti: dict[str, Any], now: float, schedulers: int) -> list[dict[str, str]]:
    """What a running task instance's state may be stuck on: no scheduler applies what its
    worker reports, or no heartbeat was recorded for long (its worker killed or frozen)."""
    found = []
    last = ti.get("heartbeat_at") or ti.get("started_at")
    if last and now - last > SILENT_AFTER:
        timeout = ti.get("heartbeat_timeout") or 0
        found.append({"reason": "silent", "text": (
            f"no heartbeat recorded for {ago(now - last)}: its worker may have been killed, "
            "frozen or cut off from the broker (see Workers)" + (
                f"; a scheduler times it out {ago(timeout)} after its last one and retries "
                "it while its retries last" if schedulers and timeout else ""))})
    if schedulers == 0:
        found.append({"reason": "no_scheduler", "text": NO_SCHEDULER})
    return found


def no_scheduler(ui: Dashboard, states: Sequence[str]) -> str:
    """A line for a page showing runs still to move (queued or running) while no scheduler
    holds a lease: nothing will move them ('' otherwise, or when none is still to move)."""
    if not any(s in ("queued", "running") for s in states):
        return ""
    with ui.store() as store:
        if live_schedulers(store, time.time()):
            return ""
    return ('<p class="why why-no_scheduler">No scheduler is running against this state '
            "store (none holds a lease): queued and running runs stay as they are until one "
            "runs: start <code>conveyor scheduler</code>.</p>")


def note(ti: dict[str, Any]) -> str:
    """What a waiting task instance waits for, in a few words: "queued 5 min ago", or when
    an up_for_retry one tries again ('' for any other state)."""
    if ti["state"] == "queued" and ti.get("queued_at"):
        return f'<span class="queued-for">queued {age(ti["queued_at"], time.time())} ago</span>'
    if ti["state"] == "up_for_retry" and ti.get("next_retry_at"):
        return f'<span class="queued-for">next try {when(ti["next_retry_at"])} UTC</span>'
    return ""


def listed(why: list[dict[str, str]]) -> str:
    """The reasons as a list ('' when none is known)."""
    if not why:
        return ""
    items = "".join(f'<li class="why-{e(w["reason"])}">{_code(w["text"])}{_see(w)}</li>'
                    for w in why)
    return f'<ul class="why">{items}</ul>'


def _code(text: str) -> str:
    """Escaped text with its `backquoted` names as code."""
    parts = e(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _see(why: dict[str, str]) -> str:
    """A link to the page that shows more (and acts: the Limits page sets limits)."""
    if why["reason"] == "limit":
        return ' · <a href="/limits">Limits</a>'
    if why["reason"] == "no_consumer":
        return ' · <a href="/queues">Queues</a>'
    if why["reason"] == "silent":
        return ' · <a href="/workers">Workers</a>'
    return ""
