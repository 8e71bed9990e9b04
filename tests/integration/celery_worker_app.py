"""A real Celery worker's app, to compare what Celery stores with what the intake stores.

Its tasks fail the way `tests.integration.worker_tasks` tasks of the same names fail on
Conveyor. Broker, result backend and queue come from the environment the test sets.
"""

from __future__ import annotations

import errno
import os

from celery import Celery

app = Celery("conveyor-reference-worker", broker=os.environ["REFERENCE_BROKER"],
             backend=os.environ["REFERENCE_BACKEND"])
app.conf.update(task_default_queue=os.environ["REFERENCE_QUEUE"], task_serializer="json",
                accept_content=["json"], result_serializer="json", result_expires=600,
                worker_enable_remote_control=False, worker_send_task_events=False,
                broker_connection_retry_on_startup=True,
                broker_transport_options={"global_keyprefix": os.environ.get(
                    "REFERENCE_KEYPREFIX", "")})


@app.task(name="t.key_error")
def key_error() -> None:
    raise KeyError("k9")


@app.task(name="t.os_error")
def os_error() -> None:
    raise OSError(errno.ENOENT, "No such file or directory", "/nonexistent/k9")
