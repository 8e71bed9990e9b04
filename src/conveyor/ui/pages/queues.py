"""Queues: each queue's depth now (ready, in flight, delayed, dead), what finished in the
last hour and how much of it failed, and a chart of both over the last hour."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conveyor.readers.queue_history import HOUR, queue_overview
from conveyor.ui.charts import depth_chart, finished_chart
from conveyor.ui.html import e, table, url, when
from conveyor.ui.http import Request, Response

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard

#: The longest window a chart may show (the sampler keeps three hours).
MAX_MINUTES = 180


def register(ui: Dashboard) -> None:
    ui.add_nav("Queues", "/queues")
    ui.router.add("GET", "/queues", queues_page)
    ui.router.add("GET", "/api/queues", queues_api)


def overview(ui: Dashboard, request: Request) -> dict[str, Any]:
    minutes = request.int_arg("minutes", int(HOUR / 60), 5, MAX_MINUTES)
    with ui.store() as store, ui.broker() as broker:
        return queue_overview(store, broker, ui.config.extra_queues, time.time(),
                              window=minutes * 60.0, scheduler_queues=ui.scheduler_queues())


def queues_api(ui: Dashboard, request: Request) -> Response:
    """Each queue's depth now, its consumers (live registered workers), tasks finished and
    failure rate over the window (`minutes`, default 60; null with `sampled` false when no
    scheduler samples the queue now), and the samples and per-minute counts behind the
    charts."""
    doc = overview(ui, request)
    # the window's ends move with the clock: left out, the page refreshes only when the
    # data changes (a new sample, a finished task, a depth), not at every poll
    return Response.json({k: v for k, v in doc.items() if k not in ("since", "until")})


def queues_page(ui: Dashboard, request: Request) -> Response:
    doc = overview(ui, request)
    minutes = round(doc["window"] / 60)
    rows = table(["queue", "ready", "in flight", "delayed", "dead", "consumers",
                  "finished / min", "failed", "failure rate"], (_row(q) for q in doc["queues"]),
                 cls="queues")
    charts = "".join(_charts(q["queue"], doc) for q in doc["queues"]
                     if q["queue"] in doc["depth"] or q["queue"] in doc["finished"])
    note = ("" if doc["depth"] else
            '<p class="empty">No depth samples yet: the scheduler records them every '
            "<code>--queue-sample-interval</code> seconds (15 by default) while it runs.</p>")
    body = (f"<h1>Queues</h1>{rows}"
            f'<p class="count">Depth now, read from the broker. Finished, failed and the '
            f"charts: the last {minutes} minutes, as the scheduler sampled them; finished "
            f"counts what registered workers reported (every task they ran; a retry "
            f"counts again); <i>not sampled</i>: no scheduler sampled the queue lately, so "
            f"its counts are unknown (not zero). Consumers: the live registered workers that "
            f"listen on it.</p>"
            f"{note}{_legend()}{charts}")
    return ui.page(request, "Queues", body, active="/queues",
                   poll=url("/api/queues", minutes=request.arg("minutes")))


def _row(q: dict[str, Any]) -> list[str]:
    cells = [f'<a href="#q-{e(q["queue"])}">{e(q["queue"])}</a>', e(q["ready"]),
             e(q["in_flight"]), e(q["delayed"]),
             (f'<a class="warn" href="{url("/dead-letters", queue=q["queue"])}">'
              f'{e(q["dead"])}</a>' if q["dead"] else "0"), _consumers(q)]
    if not q["sampled"]:
        since = (f"no scheduler has sampled it since {when(q['last_sampled'])}"
                 if q["last_sampled"] else "no scheduler has sampled it")
        gap = f'<span class="empty" title="{e(since)}: counts unknown">not sampled</span>'
        return cells + [gap, gap, gap]
    rate = q["failure_rate"]
    return cells + [e(f'{q["per_minute"]:g}'), e(q["failed"]),
                    "" if rate is None else f'<span class="{"warn" if rate else ""}">'
                                            f"{e(f'{rate:.1%}')}</span>"]


def _consumers(q: dict[str, Any]) -> str:
    """How many live workers (or schedulers) listen on the queue; none while work waits is a
    warning."""
    found = q["consumers"]
    if not found:
        cls = "warn" if q["ready"] or q["delayed"] else "empty"
        return (f'<span class="{cls}" title="no live registered worker or scheduler consumes '
                'it">none</span>')
    shown = []
    for kind in ("worker", "scheduler"):
        some = [c for c in found if c["kind"] == kind]
        if not some:
            continue
        names = ", ".join(f'{c["host"]}:{c["pid"]}' for c in some)
        text = f'{len(some)} {kind}{"s" if len(some) > 1 else ""}'
        if kind == "worker":
            slots = sum(c["concurrency"] for c in some)
            shown.append(f'<a href="/workers" title="{e(names)}">{text}</a> '
                         f'<span class="empty">({slots} slots)</span>')
        else:
            shown.append(f'<span title="{e(names)}">{text}</span>')
    return ", ".join(shown)


def _charts(queue: str, doc: dict[str, Any]) -> str:
    since, until = doc["since"], doc["since"] + doc["window"]
    depth = depth_chart(doc["depth"].get(queue, []), since, until, f"{queue}: depth")
    finished = finished_chart(doc["finished"].get(queue, []), since, until,
                              f"{queue}: finished per minute")
    return (f'<section class="queue" id="q-{e(queue)}" data-queue="{e(queue)}">'
            f'<h2>{e(queue)}</h2><div class="charts">'
            f"<figure>{depth}<figcaption>depth</figcaption></figure>"
            f"<figure>{finished}<figcaption>finished per minute</figcaption></figure>"
            f"</div></section>")


def _legend() -> str:
    keys = [("line", "ready"), ("line", "in_flight"), ("line", "delayed"), ("line", "dead"),
            ("bar", "succeeded"), ("bar", "failed")]
    return ('<p class="legend chart-legend">' + "".join(
        f'<span class="key {kind} {name}"></span>{e(name.replace("_", " "))} '
        for kind, name in keys) + "</p>")
