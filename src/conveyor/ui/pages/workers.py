"""Workers: every registered worker with its slots busy and free, the age of its last
heartbeat (stale ones marked), and what each runner slot holds: its task, for how long, and
the memory charged to it against its cap."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conveyor.readers.workers import worker_rows
from conveyor.ui.html import badge, e, seconds, table
from conveyor.ui.http import Request, Response

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard

MiB = 1024 * 1024
#: A slot using more than this share of its cap is shown as close to it.
HIGH = 0.8


def register(ui: Dashboard) -> None:
    ui.add_nav("Workers", "/workers")
    ui.router.add("GET", "/workers", workers_page)
    ui.router.add("GET", "/api/workers", workers_api)


def workers_api(ui: Dashboard, request: Request) -> Response:
    """Registered workers: queues, slots busy and free, heartbeat age, `stale`, and each
    runner slot's task and memory (bytes) against its cap (`limit`, 0: none)."""
    with ui.store() as store:
        return Response.json({"workers": worker_rows(store, time.time())})


def workers_page(ui: Dashboard, request: Request) -> Response:
    with ui.store() as store:
        rows = worker_rows(store, time.time())
    slots = sum(w["concurrency"] for w in rows if not w["stale"])
    busy = sum(w["busy"] for w in rows if not w["stale"])
    stale = sum(1 for w in rows if w["stale"])
    summary = (f'<p class="count">{len(rows)} worker(s), {busy} of {slots} slots busy'
               + (f', <span class="warn">{stale} stale</span> (no heartbeat for three '
                  "intervals: killed, frozen or cut off from the state store)" if stale else "")
               + "</p>")
    body = "<h1>Workers</h1>" + table(
        ["host", "pid", "queues", "code version", "slots", "last heartbeat", "state",
         "runners"],
        (_row(w) for w in rows), cls="workers",
        empty="no worker registered: workers register in the state store they are given "
              "with --state (CONVEYOR_STATE_URL)") + (summary if rows else "")
    return ui.page(request, "Workers", body, active="/workers", poll="/api/workers")


def _row(w: dict[str, Any]) -> list[str]:
    state = badge("stale") if w["stale"] else badge("ok")
    return [e(w["host"]), e(w["pid"]), e(w["queues"].replace(",", ", ")),
            f'<code>{e(w["code_version"])}</code>' if w["code_version"] else "",
            _slots(w["busy"], w["concurrency"]),
            f'<span title="{e(w["last_heartbeat"])}">{e(seconds(w["seconds_ago"]))} ago</span>',
            state, _runners(w["runners"])]


def _slots(busy: int, total: int) -> str:
    cells = "".join(f'<i class="{"busy" if i < busy else "free"}"></i>' for i in range(total))
    return (f'<span class="slots" title="{busy} busy, {max(0, total - busy)} free">{cells}'
            f"</span> {busy}/{total}")


def _runners(runners: dict[str, Any] | None) -> str:
    if not runners:
        return '<span class="empty">not reported</span>'
    items = "".join(f"<li>{_slot(s)}</li>" for s in runners.get("slots", []))
    cap = ' <span class="empty">(RLIMIT_AS fallback: resident memory shown, the cap is on ' \
          "address space)</span>" if runners.get("limiter") == "rlimit" else ""
    teardown = runners.get("teardown", "")
    slow = (f' <span class="empty">(a killed worker\'s runners die at {e(teardown)})</span>'
            if teardown and not teardown.startswith("real-time") else "")
    return f'<ul class="runners">{items}</ul>{cap}{slow}'


def _slot(s: dict[str, Any]) -> str:
    memory, limit = s.get("memory"), s.get("limit") or 0
    used = "memory unknown" if memory is None else f"{memory / MiB:.1f} MiB"
    if s.get("task"):
        what = (f'<b>{e(s["task"])}</b> <span class="empty">{e(s.get("queue", ""))} · '
                f'{e(seconds(s.get("seconds")))}</span>')
    else:
        what = '<span class="empty">idle</span>'
    meter = ""
    if memory is not None and limit:
        meter = (f' <meter min="0" max="{limit}" value="{min(memory, limit)}" '
                 f'high="{int(limit * HIGH)}" optimum="0"></meter>')
        used += f" of {limit / MiB:.0f} MiB"
    elif s.get("task"):
        used += ", no cap"
    return f'slot {e(s["slot"])}: {what} · <span class="mem">{e(used)}</span>{meter}'
