"""Sensors in the DAG API: `dag.wait_for_file(path, timeout=...)` and its kin add a task
that waits without a worker slot (it defers on its trigger: conveyor/triggers/sensors.py)
and returns the trigger's payload, which its children get like any upstream value.

    dag = DAG("orders")
    landed = dag.wait_for_file("/data/in/orders.csv", timeout=3600)
    dag.task(load_orders, landed)          # load_orders receives {"path", "size", "mtime"}

A `timeout` not reached fails the sensor `timed_out` (Airflow's sensor timeout); None
waits for ever. Other options are `dag.task`'s (id, retries, upstream, ...)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


class Sensors:
    """The sensor methods of `DAG` (a mixin: `self.task` is the DAG's). Each returns the
    sensor's `TaskNode` (typed Any here: dag.py imports this module, not the reverse)."""

    def task(self, task: Any, *inputs: Any, **given: Any) -> Any:
        raise NotImplementedError

    def wait_for_file(self, path: str, *, timeout: float | None = None,
                      poll_interval: float = 0.5, **options: Any) -> Any:
        """Until `path` exists; returns {"path", "size", "mtime"}."""
        from conveyor.triggers import sensors
        return self._sensor(sensors.wait_for_file, "wait_for_file", options, path=path,
                            timeout=timeout, poll_interval=poll_interval)

    def wait_for_time(self, at: datetime | float, *, timeout: float | None = None,
                      **options: Any) -> Any:
        """Until `at` (an aware datetime, or Unix seconds); returns {"at", "fired_at"}."""
        from conveyor.triggers import sensors
        when = at.timestamp() if isinstance(at, datetime) else float(at)
        return self._sensor(sensors.wait_for_time, "wait_for_time", options, at=when,
                            timeout=timeout)

    def wait_for_delay(self, seconds: float, *, timeout: float | None = None,
                       **options: Any) -> Any:
        """`seconds` from when the sensor starts; returns {"at", "fired_at"}."""
        from conveyor.triggers import sensors
        return self._sensor(sensors.wait_for_delay, "wait_for_delay", options,
                            seconds=seconds, timeout=timeout)

    def wait_for_http(self, url: str, *, status: int = 200, contains: str = "",
                      timeout: float | None = None, poll_interval: float = 5.0,
                      **options: Any) -> Any:
        """Until a GET of `url` answers `status` (with `contains` in its body);
        returns {"url", "status", "body"}."""
        from conveyor.triggers import sensors
        return self._sensor(sensors.wait_for_http, "wait_for_http", options, url=url,
                            status=status, contains=contains, timeout=timeout,
                            poll_interval=poll_interval)

    def wait_for_sql(self, url: str, query: str, *, timeout: float | None = None,
                     poll_interval: float = 5.0, **options: Any) -> Any:
        """Until `query` returns rows on `url`; returns {"rows": [...]}."""
        from conveyor.triggers import sensors
        return self._sensor(sensors.wait_for_sql, "wait_for_sql", options, url=url,
                            query=query, timeout=timeout, poll_interval=poll_interval)

    def wait_for_asset(self, asset: Any, *, timeout: float | None = None,
                       poll_interval: float = 1.0, **options: Any) -> Any:
        """Until an event of `asset` (an Asset or its URI) is recorded after the sensor
        starts; returns {"event_id", "uri", "extra", "timestamp", "source"}."""
        from conveyor.triggers import sensors
        uri = str(getattr(asset, "uri", asset))
        return self._sensor(sensors.wait_for_asset, "wait_for_asset", options, uri=uri,
                            timeout=timeout, poll_interval=poll_interval)

    def _sensor(self, task: Any, default_id: str, options: dict[str, Any],
                **kwargs: Any) -> Any:
        options.setdefault("id", default_id)
        return self.task(task, kwargs=kwargs, **options)
