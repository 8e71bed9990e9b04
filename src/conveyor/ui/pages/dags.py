"""DAGs: what the folder defines, paused or not, their last run; pause, unpause, trigger."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conveyor.readers.dags import dag_rows, load_errors
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler import operations
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.runs import trigger
from conveyor.ui.html import action_form, badge, e, seg, table, url
from conveyor.ui.http import HttpError, Request, Response, json_object

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard


def register(ui: Dashboard) -> None:
    ui.add_nav("DAGs", "/dags")
    ui.router.add("GET", "/dags", dags_page)
    ui.router.add("GET", "/api/dags", dags_api)
    ui.router.add("POST", "/api/dags/{dag_id}/pause", pause, action=True)
    ui.router.add("POST", "/api/dags/{dag_id}/unpause", unpause, action=True)
    ui.router.add("POST", "/api/dags/{dag_id}/trigger", trigger_run, action=True)


def dags_api(ui: Dashboard, request: Request) -> Response:
    """The DAGs of the folder: schedule, tasks, paused, next and last run; files that
    failed to load."""
    loaded = ui.dags()
    with ui.store() as store:
        rows = dag_rows(loaded, store)
    return Response.json({"dags": rows, "errors": load_errors(loaded)})


def dags_page(ui: Dashboard, request: Request) -> Response:
    loaded = ui.dags()
    with ui.store() as store:
        rows = dag_rows(loaded, store)
    errors = load_errors(loaded)
    body = ("<h1>DAGs</h1>"
            + table(["DAG", "schedule", "tasks", "next run", "last run", "", "paused", ""],
                    (_row(r) for r in rows), cls="dags",
                    empty=f"no DAG in {ui.config.scheduler.dags_folder}")
            + ("<h2>Files that did not load</h2>" + "".join(
                f'<pre class="error">{e(x["error"])}</pre>' for x in errors) if errors else ""))
    return ui.page(request, "DAGs", body, active="/dags", poll="/api/dags")


def _row(row: dict[str, Any]) -> list[str]:
    dag_id = row["dag_id"]
    base = f"/api/dags/{seg(dag_id)}"
    toggle = (action_form(f"{base}/unpause", "Unpause") if row["paused"]
              else action_form(f"{base}/pause", "Pause",
                               confirm=f"Pause {dag_id}? Running runs finish; no new run "
                                       "starts until it is unpaused."))
    run = row["last_run"]
    return [f'<a href="{url("/runs", dag=dag_id)}">{e(dag_id)}</a>', e(row["schedule"] or "—"),
            e(row["tasks"]), e(row["next_run"][:19].replace("T", " ")),
            f'<a href="/runs/{seg(run)}">{e(run)}</a>' if run else "", badge(row["last_state"]),
            "paused" if row["paused"] else "", toggle + " " + _trigger_form(base)]


def _trigger_form(base: str) -> str:
    return (f'<form class="action trigger" method="post" action="{e(base)}/trigger">'
            '<input name="conf" placeholder="conf: {&quot;key&quot;: 1}" size="18" '
            'aria-label="run conf (JSON object)"><button type="submit">Trigger</button></form>')


def _dag(ui: Dashboard, dag_id: str) -> DAG:
    dag = ui.dags().dags.get(dag_id)
    if dag is None:
        raise HttpError(404, f"no DAG {dag_id!r} loads from {ui.config.scheduler.dags_folder}")
    return dag


def pause(ui: Dashboard, request: Request, dag_id: str) -> Response:
    """Pause a DAG: running runs finish, no new run starts."""
    return _set_paused(ui, dag_id, True)


def unpause(ui: Dashboard, request: Request, dag_id: str) -> Response:
    """Let a paused DAG start runs again."""
    return _set_paused(ui, dag_id, False)


def _set_paused(ui: Dashboard, dag_id: str, paused: bool) -> Response:
    dag = _dag(ui, dag_id)
    with ui.store() as store:
        operations.set_paused(store, dag, paused, time.time())
    if not paused:
        daemons.poke(ui.config.scheduler, "")
    word = "paused" if paused else "unpaused"
    return Response.json({"dag_id": dag_id, "paused": paused, "message": f"DAG {dag_id} {word}"})


def trigger_run(ui: Dashboard, request: Request, dag_id: str) -> Response:
    """Create a run of a DAG now; body: {"conf": {...}} (optional; a JSON object or its
    text)."""
    dag = _dag(ui, dag_id)
    conf = json_object(request.form().get("conf"), "conf")
    with ui.store() as store:
        run_id = trigger(store, dag, time.time(), executors=ui.config.scheduler.executors,
                         conf=conf, run_type="manual")
    daemons.poke(ui.config.scheduler, run_id)
    return Response.json({"run_id": run_id, "dag_id": dag_id, "state": "queued",
                          "message": f"run {run_id} of {dag_id} queued",
                          "location": f"/runs/{seg(run_id)}"})
