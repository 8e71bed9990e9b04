"""A task module with a `worker_process_init` hook, for the hook's worker tests (-A).

INIT_HOOK_LOG names a file the hook appends its pid to; INIT_HOOK_FAIL=1 makes it raise.
"""

from __future__ import annotations

import os

from conveyor.tasks import task, worker_process_init

_opened_in: int | None = None


@worker_process_init
def open_resources() -> None:
    global _opened_in
    if os.environ.get("INIT_HOOK_FAIL") == "1":
        raise RuntimeError("the database is not there")
    _opened_in = os.getpid()
    with open(os.environ["INIT_HOOK_LOG"], "a") as log:
        log.write(f"{os.getpid()}\n")


@task(name="t.init_pids")
def init_pids() -> dict[str, int | None]:
    """Which process runs the task, and in which one its resources were opened."""
    return {"pid": os.getpid(), "opened_in": _opened_in}
