"""An unchanged Celery producer, as a team migrating to Conveyor has one (test dependency).

The tasks below are the producer's view of tasks that Conveyor workers now run: the
bodies never run here (no Celery worker is started); Conveyor runs the functions
registered under the same names in `tests.integration.worker_tasks`.
"""

from __future__ import annotations

from celery import Celery


def producer(broker_url: str, backend_url: str, queue: str, keyprefix: str = "") -> Celery:
    """A Celery app publishing JSON (Celery's default) to `queue`, results in Redis.

    `keyprefix` (Redis broker) puts every key kombu writes under it (global_keyprefix): its
    queue, bindings and its `unacked` hash, which without one is shared by every kombu
    client of the database, so anyone's restore could bring a test's messages back after
    the test deleted its queue. Its tasks are `app.tasks["t.add"]`, `["t.tsum"]` and
    `["t.fail"]`.
    """
    app = Celery("conveyor-migration-test", broker=broker_url, backend=backend_url)
    app.conf.update(task_default_queue=queue, task_serializer="json",
                    accept_content=["json"], result_serializer="json",
                    broker_connection_retry_on_startup=True, result_expires=600)
    if keyprefix:
        app.conf.broker_transport_options = {"global_keyprefix": keyprefix}

    @app.task(name="t.add", shared=False)
    def add(a: int, b: int) -> int:  # runs on Conveyor, never here
        raise AssertionError("the Celery producer must not run tasks itself")

    @app.task(name="t.tsum", shared=False)
    def tsum(values: list[int]) -> int:  # a chord's callback, run on Conveyor too
        raise AssertionError("the Celery producer must not run tasks itself")

    @app.task(name="t.fail", shared=False)
    def fail(message: str = "boom") -> None:
        raise AssertionError("the Celery producer must not run tasks itself")

    return app
