"""The tasks behind the DAG API's sensors (`dag.wait_for_file(...)`, scheduler/sensors.py):
each defers on its trigger in its first segment and, resumed, returns the trigger's payload
(what its children receive). Registered under `conveyor.sensors.*`: a worker that imports
a DAG file using them has them."""

from __future__ import annotations

from typing import Any

from conveyor.context import context
from conveyor.tasks import Defer, task
from conveyor.triggers.assets import AssetTrigger
from conveyor.triggers.base import Trigger
from conveyor.triggers.builtin import (
    DelayTrigger,
    FileTrigger,
    HttpTrigger,
    SqlTrigger,
    TimeTrigger,
)


def _wait(trigger: Trigger, timeout: float | None) -> Any:
    if context.trigger_event is None:
        raise Defer(trigger, timeout=timeout)
    return context.trigger_event


@task(name="conveyor.sensors.wait_for_file", max_retries=0)
def wait_for_file(path: str, timeout: float | None = None, poll_interval: float = 0.5) -> Any:
    return _wait(FileTrigger(path, poll_interval), timeout)


@task(name="conveyor.sensors.wait_for_time", max_retries=0)
def wait_for_time(at: float, timeout: float | None = None) -> Any:
    return _wait(TimeTrigger(at), timeout)


@task(name="conveyor.sensors.wait_for_delay", max_retries=0)
def wait_for_delay(seconds: float, timeout: float | None = None) -> Any:
    return _wait(DelayTrigger(seconds), timeout)


@task(name="conveyor.sensors.wait_for_http", max_retries=0)
def wait_for_http(url: str, status: int = 200, contains: str = "", timeout: float | None = None,
                  poll_interval: float = 5.0) -> Any:
    return _wait(HttpTrigger(url, status, contains, poll_interval), timeout)


@task(name="conveyor.sensors.wait_for_sql", max_retries=0)
def wait_for_sql(url: str, query: str, timeout: float | None = None,
                 poll_interval: float = 5.0) -> Any:
    return _wait(SqlTrigger(url, query, poll_interval), timeout)


@task(name="conveyor.sensors.wait_for_asset", max_retries=0)
def wait_for_asset(uri: str, timeout: float | None = None, poll_interval: float = 1.0) -> Any:
    return _wait(AssetTrigger(uri, poll_interval), timeout)
