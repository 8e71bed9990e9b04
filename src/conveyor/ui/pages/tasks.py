"""Acting on one task instance: clear, mark success or failed, retry now (token needed).

Each action is the operation `conveyor tasks clear|mark|retry` runs (conveyor.scheduler.
operations: one transaction with the run locked), then the poke that makes a running
scheduler act at once. The buttons a task shows depend on its state (`OFFERED`): what the
operation would refuse is not offered. Cancel, once it exists, is one more verb here and in
`OFFERED` (for queued and running tasks), next to mark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from conveyor.readers import runs as readers
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler import operations
from conveyor.scheduler.errors import RunError
from conveyor.ui.html import action_form, seg
from conveyor.ui.http import HttpError, Request, Response
from conveyor.ui.pages import cancel as cancelling

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard

#: The actions a task instance in each state offers, in button order.
OFFERED: dict[str, tuple[str, ...]] = {
    "pending": ("success", "failed", "cancel"),
    "queued": ("success", "failed", "cancel"),
    "running": ("success", "failed", "cancel"),
    "up_for_retry": ("retry", "clear", "success", "failed", "cancel"),
    "success": ("clear", "failed"),
    "failed": ("clear", "success"),
    "upstream_failed": ("clear", "success", "failed"),
    "skipped": ("clear", "success", "failed"),
    "cancelled": ("clear", "success", "failed"),
}
LABELS = {"retry": "Retry now", "clear": "Clear", "success": "Mark success",
          "failed": "Mark failed"}


def register(ui: Dashboard) -> None:
    base = "/api/runs/{run_id}/tasks/{task_id}"
    ui.router.add("POST", f"{base}/clear", clear, action=True)
    ui.router.add("POST", f"{base}/mark", mark, action=True)
    ui.router.add("POST", f"{base}/retry", retry, action=True)


def buttons(run_id: str, ti: dict[str, Any], *, only: bool = False) -> str:
    """The action buttons for a task instance in its state (empty for an unknown state);
    `only`: also "Clear this task only" (the task page has room for it)."""
    base = f"/api/runs/{seg(run_id)}/tasks/{seg(ti['task_id'])}"
    task = ti["task_id"]
    forms = []
    for verb in OFFERED.get(ti["state"], ()):
        if verb == "clear":
            forms.append(action_form(f"{base}/clear", LABELS[verb], confirm=(
                f"Clear {task} and everything downstream of it? They run again, each "
                "with a fresh attempt budget.")))
            if only:
                forms.append(action_form(f"{base}/clear", "Clear this task only",
                                         fields={"only": "true"},
                                         confirm=f"Clear {task} alone (not downstream)?"))
        elif verb == "retry":
            forms.append(action_form(f"{base}/retry", LABELS[verb]))
        elif verb == "cancel":
            forms.append(cancelling.task_button(run_id, task))
        else:
            forms.append(action_form(f"{base}/mark", LABELS[verb], fields={"state": verb},
                                     confirm=f"Mark {task} {verb}?"))
    return " ".join(forms)


def clear(ui: Dashboard, request: Request, run_id: str, task_id: str) -> Response:
    """Clear a task instance and (unless {"only": true}) everything downstream: back to
    pending with a fresh attempt budget; they run again (`conveyor tasks clear`), on the
    run's code version unless {"latest_code": true}."""
    form = request.form()
    only = form.get("only") in (True, "true", "1")
    latest = form.get("latest_code") in (True, "true", "1")
    _exists(ui, run_id, task_id)
    with refused(), ui.store() as store:
        cleared = operations.clear(store, run_id, task_id, time.time(), downstream=not only,
                                   latest_code=latest)
    daemons.poke(ui.config.scheduler, run_id)
    return Response.json({"run_id": run_id, "cleared": cleared,
                          "message": f"cleared {', '.join(cleared)} in run {run_id}: they "
                                     "run again"})


def mark(ui: Dashboard, request: Request, run_id: str, task_id: str) -> Response:
    """Set a task instance's state by hand; body: {"state": "success" or "failed"}
    (`conveyor tasks mark`)."""
    state = str(request.form().get("state") or "")
    if state not in operations.MARKABLE:
        raise HttpError(400, f"state={state!r}: mark a task one of "
                        f"{', '.join(operations.MARKABLE)} (nothing was changed)")
    _exists(ui, run_id, task_id)
    with refused(), ui.store() as store:
        before = operations.mark(store, run_id, task_id, state, time.time())
    daemons.poke(ui.config.scheduler, run_id)
    return Response.json({"run_id": run_id, "task_id": task_id, "state": state,
                          "was": before.state,
                          "message": f"{task_id} in run {run_id} marked {state} (was "
                                     f"{before.state})"})


def retry(ui: Dashboard, request: Request, run_id: str, task_id: str) -> Response:
    """Run an up_for_retry task instance's next attempt now instead of after its retry
    delay; the attempt budget is unchanged (`conveyor tasks retry`)."""
    _exists(ui, run_id, task_id)
    with refused(), ui.store() as store:
        before = operations.retry_now(store, run_id, task_id, time.time())
    daemons.poke(ui.config.scheduler, run_id)
    return Response.json({"run_id": run_id, "task_id": task_id,
                          "attempt": before.attempt + 1,
                          "message": f"{task_id} in run {run_id}: attempt "
                                     f"{before.attempt + 1} of {before.max_attempts} "
                                     "is due now"})


@contextmanager
def refused() -> Iterator[None]:
    """An operation that refuses in this state (clear while running, retry when not
    waiting to) is a 409: the task's state, not the request, is in the way."""
    try:
        yield
    except RunError as exc:
        raise HttpError(409, str(exc)) from None


def _exists(ui: Dashboard, run_id: str, task_id: str) -> None:
    """404 for a run or task that is not there (the operations say 400-worthy things)."""
    with ui.store() as store:
        if readers.run_doc(store, run_id) is None:
            raise HttpError(404, f"no run {run_id!r} in the state store: see the run list")
        if readers.task_detail(store, run_id, task_id) is None:
            raise HttpError(404, f"no task {task_id!r} in run {run_id!r}")
