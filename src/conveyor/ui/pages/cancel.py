"""Cancel from the dashboard (with the token): a run, one task of a run, or any message by
its id. The buttons post here, as the other actions do; each answer says what happened:
`result` is cancelled, already_cancelled or finished (nothing changed), and an unknown run or
task is a 404 whose `result` is unknown. The work is `scheduler/cancel.py` and
`Client.cancel` (README "Operating DAGs and runs", "Dashboard")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from conveyor.client import Client
from conveyor.scheduler import cancel
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler.errors import RunError
from conveyor.ui.html import action_form, seg
from conveyor.ui.http import Request, Response

if TYPE_CHECKING:
    from conveyor.state.store import Store
    from conveyor.ui.app import Dashboard

#: The run states a run can be cancelled in (its page offers the button).
CANCELLABLE = ("queued", "running")


def register(ui: Dashboard) -> None:
    ui.router.add("POST", "/api/runs/{run_id}/cancel", cancel_run, action=True)
    ui.router.add("POST", "/api/runs/{run_id}/tasks/{task_id}/cancel", cancel_task,
                  action=True)
    ui.router.add("POST", "/api/messages/{message_id}/cancel", cancel_message, action=True)


def run_button(run: dict[str, object]) -> str:
    """The run page's Cancel button, for a run that has not ended ('' otherwise)."""
    if run["state"] not in CANCELLABLE:
        return ""
    return action_form(f"/api/runs/{seg(str(run['run_id']))}/cancel", "Cancel run",
                       confirm="Cancel this run? What runs is stopped, what waits never "
                               "starts; the run ends cancelled.")


def task_button(run_id: str, task_id: str) -> str:
    """A task instance's Cancel button (tasks.py offers it in the states that allow it)."""
    return action_form(f"/api/runs/{seg(run_id)}/tasks/{seg(task_id)}/cancel", "Cancel",
                       confirm=f"Cancel {task_id}? If it runs it is stopped; what is below "
                               "it will not run.")


def cancel_run(ui: Dashboard, request: Request, run_id: str) -> Response:
    """Cancel a run: what is queued or running is stopped, what is pending never starts;
    the run ends cancelled (`conveyor runs cancel`)."""
    return _acted(ui, run_id, "", lambda store, cancelling: cancel.cancel_run(
        store, run_id, time.time(), cancelling))


def cancel_task(ui: Dashboard, request: Request, run_id: str, task_id: str) -> Response:
    """Cancel one task of a run; what is below it becomes upstream_failed (`conveyor tasks
    cancel RUN TASK`)."""
    return _acted(ui, run_id, task_id, lambda store, cancelling: cancel.cancel_task(
        store, run_id, task_id, time.time(), cancelling))


def cancel_message(ui: Dashboard, request: Request, message_id: str) -> Response:
    """Cancel any message by its id: it never starts, or its worker stops it
    (`Client.cancel`, `conveyor tasks cancel MESSAGE_ID`)."""
    with _client(ui) as client:
        result = client.cancel(message_id)
    return Response.json({"message_id": message_id, "result": result.value,
                          "message": result.describe(message_id)})


def _acted(ui: Dashboard, run_id: str, task_id: str,
           act: Callable[[Store, cancel.Cancel], cancel.Outcome]) -> Response:
    """Run a cancel of the run or task, poke the schedulers, and say what happened; a run
    or task the state store does not have is a 404 whose `result` is unknown."""
    ids = {"run_id": run_id, **({"task_id": task_id} if task_id else {})}
    try:
        with ui.store() as store, _client(ui) as client:
            done = act(store, client.cancel)
    except RunError as exc:
        return Response.json({**ids, "result": "unknown", "error": str(exc)}, 404)
    daemons.poke(ui.config.scheduler, run_id)
    what = f"{task_id} in run {run_id}" if task_id else f"run {run_id}"
    return Response.json({**ids, **done.doc(), "message": done.describe(what)})


@contextmanager
def _client(ui: Dashboard) -> Iterator[Client]:
    """A client on the dashboard's broker and flow-control store, for this request."""
    client = Client.from_settings(ui.config.scheduler.settings)
    try:
        yield client
    finally:
        client.close()
