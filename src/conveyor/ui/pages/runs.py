"""Runs: the list (by DAG, state and logical date), one run as a graph and as a grid of the
DAG's recent runs x tasks, and one task instance with its attempts."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from conveyor.readers import runs as readers
from conveyor.ui import graph, waiting
from conveyor.ui.html import badge, e, seconds, seg, select, table, url, when
from conveyor.ui.http import HttpError, Request, Response
from conveyor.ui.pages import cancel as cancelling
from conveyor.ui.pages.tasks import buttons

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard

#: Runs the list shows unless asked (`limit`), and the most it shows.
LIMIT, MAX_LIMIT = 100, 5000
#: Columns of the grid: the DAG's newest runs.
GRID_RUNS = 20
DAY = 86400.0


def register(ui: Dashboard) -> None:
    ui.add_nav("Runs", "/runs")
    ui.router.add("GET", "/", lambda ui, request: Response(302, headers={"Location": "/runs"}))
    ui.router.add("GET", "/runs", runs_page)
    ui.router.add("GET", "/api/runs", runs_api)
    ui.router.add("GET", "/runs/{run_id}", run_page)
    ui.router.add("GET", "/api/runs/{run_id}", run_api)
    ui.router.add("GET", "/runs/{run_id}/tasks/{task_id}", task_page)
    ui.router.add("GET", "/api/runs/{run_id}/tasks/{task_id}", task_api)


# -- the list -------------------------------------------------------------------------------

def filters(request: Request) -> dict[str, Any]:
    """The list's filters from the query string: dag, state, since/until dates, limit."""
    state = request.arg("state")
    if state and state not in readers.STATES:
        raise HttpError(400, f"state={state!r}: use one of {', '.join(readers.STATES)}")
    return {"dag_id": request.arg("dag"), "state": state,
            "since": _date(request, "since", 0.0, end=False),
            "until": _date(request, "until", readers.NEVER, end=True),
            "limit": request.int_arg("limit", LIMIT, 1, MAX_LIMIT)}


def _date(request: Request, name: str, default: float, *, end: bool) -> float:
    """A date (2026-11-23: the whole day) or an ISO-8601 time, as Unix seconds."""
    raw = request.arg(name)
    if not raw:
        return default
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise HttpError(400, f"{name}={raw!r}: give a date (2026-11-23) or an ISO-8601 "
                        "time") from None
    stamp = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return stamp + DAY if end and len(raw) == 10 else stamp


def runs_api(ui: Dashboard, request: Request) -> Response:
    """Runs newest first; filters: dag, state, since, until (dates or ISO times), limit."""
    with ui.store() as store:
        rows = readers.find_runs(store, **filters(request))
    return Response.json({"runs": rows})


def runs_page(ui: Dashboard, request: Request) -> Response:
    chosen = filters(request)
    with ui.store() as store:
        rows = readers.find_runs(store, **chosen)
        dag_ids = readers.dag_ids(store)
    body = (f"<h1>Runs</h1>{waiting.no_scheduler(ui, [r['state'] for r in rows])}"
            f"{_filter_form(request, dag_ids)}"
            + table(["run", "DAG", "state", "type", "logical date", "created", "took"],
                    (_run_row(r) for r in rows), cls="runs", empty="no run matches")
            + f'<p class="count">{len(rows)} run(s), newest first'
            + (f' (the first {chosen["limit"]}: raise <code>limit</code> for more)'
               if len(rows) == chosen["limit"] else "") + "</p>")
    query = {k: request.arg(k) for k in ("dag", "state", "since", "until", "limit")}
    return ui.page(request, "Runs", body, active="/runs", poll=url("/api/runs", **query))


def _filter_form(request: Request, dag_ids: list[str]) -> str:
    return (f'<form class="filters" method="get" action="/runs">'
            f'<label>DAG {select("dag", dag_ids, request.arg("dag"))}</label>'
            f'<label>state {select("state", readers.STATES, request.arg("state"))}</label>'
            f'<label>from <input type="date" name="since" value="{e(request.arg("since"))}">'
            f'</label><label>to <input type="date" name="until" '
            f'value="{e(request.arg("until"))}"></label>'
            f'<button type="submit">Filter</button></form>')


@functools.lru_cache(maxsize=256)
def _dag_link(dag_id: str) -> str:
    return f'<a href="{url("/runs", dag=dag_id)}">{e(dag_id)}</a>'


def _run_row(run: dict[str, Any]) -> list[str]:
    return [f'<a href="/runs/{seg(run["run_id"])}">{e(run["run_id"])}</a>',
            _dag_link(run["dag_id"]),
            badge(run["state"]) + _missed(run), e(run["run_type"]), when(run["logical_date"]),
            when(run["created_at"]), seconds(readers.took(run))]


# -- one run --------------------------------------------------------------------------------

def run_api(ui: Dashboard, request: Request, run_id: str) -> Response:
    """One run: its task instances, their attempts, the DAG's edges, and `waiting`: for each
    queued task, why it has not started as far as is known (no worker consumes its queue,
    a full limit, nothing publishes it, no scheduler), and for each running one what holds
    it (no heartbeat for long, no scheduler)."""
    with ui.store() as store:
        detail = readers.run_detail(store, run_id)
    if detail is None:
        raise HttpError(404, f"no run {run_id!r} in the state store")
    return Response.json({**detail, "waiting": waiting.reasons(ui, detail["tasks"])})


def run_page(ui: Dashboard, request: Request, run_id: str) -> Response:
    with ui.store() as store:
        detail = readers.run_detail(store, run_id)
        if detail is None:
            raise HttpError(404, f"no run {run_id!r} in the state store: see the run list")
        grid_rows = readers.grid(store, detail["run"]["dag_id"], GRID_RUNS)
        source = readers.run_source(store, run_id)
    run, mapped = detail["run"], readers.map_summary(detail["tasks"])
    tasks = [t for t in detail["tasks"] if t.get("map_task") is None]  # instances: task page
    why = waiting.reasons(ui, tasks)
    states = {t["task_id"]: t["state"] for t in tasks}
    order = [t["task_id"] for t in tasks]
    edges = [(up, down) for up, down in detail["edges"]]
    drawing = graph.svg(order, edges, lambda t: states.get(t, ""),
                        lambda t: f"/runs/{seg(run_id)}/tasks/{seg(t)}")
    body = (_run_header(run, detail["deadline"], detail["code"])
            + f'<div class="actions">{cancelling.run_button(run)}</div>'
            + waiting.no_scheduler(ui, [run["state"]])
            + f'<section><h2>Graph</h2><div class="graph">{drawing}</div>{_legend()}</section>'
            + f'<section><h2>Grid: the newest {GRID_RUNS} runs of {e(run["dag_id"])}</h2>'
            + grid(grid_rows, order, run_id) + "</section>"
            + "<section><h2>Task instances</h2>"
            + table(["task", "state", "attempt", "executor", "queue", "started", "took", "host",
                     "pid", "result", "error", ""],
                    (_ti_row(run_id, t, why, mapped.get(t["task_id"], "")) for t in tasks),
                    cls="tasks") + "</section>" + _callbacks(detail["callbacks"])
            + _source(source))
    return ui.page(request, f"Run {run_id}", body, active="/runs",
                   poll=f"/api/runs/{seg(run_id)}")


def _missed(run: dict[str, Any]) -> str:
    """A mark on a run that missed its deadline."""
    return (' <span class="st st-failed" title="it had not ended by its deadline">deadline '
            'missed</span>' if run.get("deadline_missed_at") is not None else "")


def _deadline(deadline: dict[str, Any] | None) -> str:
    if deadline is None:
        return ""
    found = f' (found at {when(deadline["missed_at"])})' if deadline["missed"] else ""
    return (f'<dt>deadline</dt><dd>{when(deadline["at"])} '
            f'<strong>{e(deadline["status"])}</strong>{found}</dd>')


def _callbacks(callbacks: list[dict[str, Any]]) -> str:
    """The callbacks the run fired, and how each went."""
    if not callbacks:
        return ""
    rows = ([e(c["kind"]), e(f'{c["task_id"]} #{c["attempt"]}' if c["ti_id"] else "run"),
             f'<code>{e(c["task"])}</code>', e(c["queue"]), badge(c["state"]),
             when(c["created_at"]), e((c["error"] or "").split("\n", 1)[0])]
            for c in callbacks)
    return ("<section><h2>Callbacks</h2>" + table(
        ["kind", "of", "callback", "queue", "state", "fired", "error"], rows) + "</section>")


def _source(source: dict[str, Any] | None) -> str:
    """The DAG file as it was when the run was created (Airflow 3's pinned DAG version)."""
    if source is None:
        return ""
    return (f'<section><h2>DAG source</h2><details><summary><code>{e(source["file"])}</code> '
            f'as it was when this run was created (version {e(source["version"])})</summary>'
            f'<pre class="source">{e(source["source"])}</pre></details></section>')


def _code(code: dict[str, Any] | None) -> str:
    """Which code the run ran on, and whether it is pinned to it."""
    if code is None:
        return ""
    version = f'<code>{e(code["version"])}</code>' if code["version"] else "no task started yet"
    return f'<dt>code version</dt><dd>{version}{", pinned" if code["pinned"] else ""}</dd>'


def _run_header(run: dict[str, Any], deadline: dict[str, Any] | None = None,
                code: dict[str, Any] | None = None) -> str:
    took = readers.took(run)
    return (f'<h1>Run <code>{e(run["run_id"])}</code> {badge(run["state"])}'
            f'{_missed(run)}</h1>'
            f'<dl class="facts"><dt>DAG</dt><dd><a href="{url("/runs", dag=run["dag_id"])}">'
            f'{e(run["dag_id"])}</a> (version {e(run["dag_version"])})</dd>'
            f'{_code(code)}<dt>type</dt><dd>{e(run["run_type"])}</dd>'
            f'<dt>logical date</dt><dd>{when(run["logical_date"])}</dd>'
            f'<dt>created</dt><dd>{when(run["created_at"])}</dd>'
            f'<dt>took</dt><dd>{seconds(took) or "—"}</dd>{_deadline(deadline)}'
            f'<dt>conf</dt><dd><code>{e(run["conf"])}</code></dd></dl>')


def _legend() -> str:
    names = ("pending", "queued", "running", "up_for_retry", "success", "failed",
             "upstream_failed", "skipped", "cancelled")
    return '<p class="legend">' + " ".join(badge(s) for s in names) + "</p>"


def grid(rows: list[dict[str, Any]], order: list[str], current: str) -> str:
    """Airflow's grid: a row per task, a column per run (oldest left), a cell per instance."""
    runs: dict[str, dict[str, Any]] = {}
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        runs.setdefault(row["run_id"], row)
        cells[row["task_id"], row["run_id"]] = row
    tasks = order + sorted({t for t, _ in cells} - set(order))
    head = "".join(
        f'<th><a href="/runs/{seg(r)}" class="bar st-{e(info["run_state"])}'
        f'{" current" if r == current else ""}" title="{e(r)}: {e(info["run_state"])}">'
        f'</a></th>' for r, info in runs.items())
    body = []
    run_paths = {r: f"/runs/{e(seg(r))}/tasks/" for r in runs}
    for task in tasks:   # 20 runs x 200 tasks is 4,000 cells: each small, and quick to make
        name = e(seg(task))
        line = "".join(_cell(cells[task, r], f"{run_paths[r]}{name}") if (task, r) in cells
                       else "<td></td>" for r in runs)
        body.append(f'<tr title="{e(task)}"><th class="task">{e(task)}</th>{line}</tr>')
    return (f'<table class="grid"><thead><tr><th></th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _cell(cell: dict[str, Any], href: str) -> str:
    """A grid cell; a mapped task's says how many instances it has."""
    count = cell.get("map_count")
    if not count:
        return f'<td><a class="st-{e(cell["state"])}" href="{href}"></a></td>'
    return (f'<td><a class="st-{e(cell["state"])} mapped" href="{href}" '
            f'title="{count} mapped">{count}</a></td>')


def _ti_row(run_id: str, ti: dict[str, Any], why: waiting.Reasons, mapped: str = ""
            ) -> list[str]:
    result = ti.get("result")
    return [f'<a href="/runs/{seg(run_id)}/tasks/{seg(ti["task_id"])}">{e(ti["task_id"])}</a>',
            badge(ti["state"]) + (f' <span class="mapped">{e(mapped)}</span>' if mapped
                                  else ""),
            f'{ti["attempt"]}/{ti["max_attempts"]}', e(ti["executor"]),
            e(ti["queue"]), waiting.note(ti) or when(ti["started_at"]),
            seconds(readers.took(ti)), e(ti["hostname"]), e(ti["pid"]),
            f"<code>{e(readers.short(json.dumps(result)))}</code>" if result is not None else "",
            e((ti["error"] or "").split("\n", 1)[0][:120])
            + waiting.listed(why.get(ti["task_id"], [])), buttons(run_id, ti)]


# -- one task instance ----------------------------------------------------------------------

def task_api(ui: Dashboard, request: Request, run_id: str, task_id: str) -> Response:
    """One task instance and every attempt of it (host, pid, outcome, result, error), and
    `waiting`: while it is queued, why it has not started as far as is known (running: what
    holds it)."""
    with ui.store() as store:
        detail = readers.task_detail(store, run_id, task_id)
    if detail is None:
        raise HttpError(404, f"no task {task_id!r} in run {run_id!r}")
    why = waiting.reasons(ui, [detail["task"]]).get(task_id, [])
    return Response.json({**detail, "waiting": why})


def task_page(ui: Dashboard, request: Request, run_id: str, task_id: str) -> Response:
    with ui.store() as store:
        detail = readers.task_detail(store, run_id, task_id)
    if detail is None:
        raise HttpError(404, f"no task {task_id!r} in run {run_id!r}")
    ti, attempts = detail["task"], detail["attempts"]
    why = waiting.reasons(ui, [ti]).get(task_id, [])
    up = ti.get("map_task")
    body = (f'<p class="crumbs"><a href="/runs/{seg(run_id)}">run {e(run_id)}</a>'
            + (f' · <a href="/runs/{seg(run_id)}/tasks/{seg(up)}">{e(up)}</a>' if up else "")
            + "</p>"
            f'<h1>Task <code>{e(task_id)}</code> {badge(ti["state"])} '
            f'{waiting.note(ti)}</h1>{waiting.listed(why)}'
            f'<dl class="facts"><dt>attempt</dt><dd>{ti["attempt"]} of {ti["max_attempts"]}'
            f'</dd><dt>executor</dt><dd>{e(ti["executor"])}</dd><dt>queue</dt>'
            f'<dd>{e(ti["queue"])}</dd><dt>host</dt><dd>{e(ti["hostname"] or "—")} '
            f'(pid {e(ti["pid"] or "—")})</dd><dt>took</dt>'
            f'<dd>{seconds(readers.took(ti)) or "—"}</dd>{_rule(ti)}</dl>'
            f'<div class="actions">{buttons(run_id, ti, only=True)}</div>'
            + _value_block("Return value", ti.get("result"))
            + (f'<h2>Error</h2><pre class="error">{e(ti["error"])}</pre>' if ti["error"] else "")
            + _instances(run_id, detail["instances"])
            + "<h2>Attempts</h2>"
            + table(["attempt", "outcome", "host", "pid", "queued", "started", "ended", "took",
                     "result", "error"], (_attempt_row(a) for a in attempts),
                    empty="no attempt has ended yet")
            + "<h2>Log</h2>" + _logs(attempts))
    return ui.page(request, f"{task_id} · {run_id}", body, active="/runs",
                   poll=f"/api/runs/{seg(run_id)}/tasks/{seg(task_id)}")


def _rule(ti: dict[str, Any]) -> str:
    """The task's trigger rule (Airflow's), and whether it is a branch."""
    spec = ti.get("spec") or {}
    branch = " · branch: follows the downstream tasks it returns" if "branch" in spec else ""
    return (f'<dt>trigger rule</dt><dd><code>{e(spec.get("trigger_rule", "all_success"))}'
            f'</code>{branch}</dd>')


def _instances(run_id: str, instances: list[dict[str, Any]]) -> str:
    """A mapped task's instances, by index, each linked to its own page (logs, attempts)."""
    if not instances:
        return ""
    summary = readers.map_summary(instances)
    rows = ([f'<a href="/runs/{seg(run_id)}/tasks/{seg(i["task_id"])}">{i["map_index"]}</a>',
             badge(i["state"]), f'{i["attempt"]}/{i["max_attempts"]}', e(i["hostname"]),
             seconds(readers.took(i)), f'<code>{e(readers.short_value(i["result"]))}</code>',
             e((i["error"] or "").split("\n", 1)[0][:120])] for i in instances)
    return (f'<h2>Mapped instances ({e(next(iter(summary.values()), ""))})</h2>'
            + table(["index", "state", "attempt", "host", "took", "result", "error"], rows,
                    cls="tasks"))


def _logs(attempts: list[dict[str, Any]]) -> str:
    """Each attempt's last lines of output (the worker sends up to 50 with the outcome)."""
    shown = [a for a in attempts if a["log"]]
    if not shown:
        return ('<p class="empty">no output: lines a task prints arrive with its attempt\'s '
                "outcome (the last 50)</p>")
    return "".join(
        f'<details class="log"{" open" if a is shown[-1] else ""}><summary>attempt '
        f'{a["attempt"]} ({e(a["outcome"])}): {len(a["log"])} line(s)</summary>'
        f'<pre class="log">{e(chr(10).join(a["log"]))}</pre></details>' for a in shown)


def _value_block(title: str, value: Any) -> str:
    if value is None:
        return ""
    return f'<h2>{e(title)}</h2><pre class="value">{e(json.dumps(value, indent=2))}</pre>'


def _attempt_row(a: dict[str, Any]) -> list[str]:
    result = a.get("result")
    return [str(a["attempt"]), badge(a["outcome"]), e(a["hostname"]), e(a["pid"]),
            when(a["queued_at"]), when(a["started_at"]), when(a["ended_at"]),
            seconds(a["took"]),
            f"<code>{e(readers.short(json.dumps(result)))}</code>" if result is not None else "",
            f'<pre class="error">{e(a["error"])}</pre>' if a["error"] else ""]
