"""The package's public API: what `from conveyor import ...` gives, and what it costs.

Every worker process (supervisor, zygote, lanes, runners) imports `conveyor` first, so the
API must not drag the scheduler's daemon, the brokers' client libraries, croniter or
kubernetes into them (`benchmarks/worker_footprint.py` measures the footprint).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import conveyor
from conveyor import DAG, Client, Retry, task
from conveyor.tasks import Task

#: Modules a plain `import conveyor` must not load (the worker's footprint).
HEAVY = ("croniter", "dateutil", "kubernetes", "redis", "pika", "psycopg", "kombu", "tenacity",
         "prometheus_client", "conveyor.broker", "conveyor.scheduler.daemon",
         "conveyor.state", "conveyor.worker", "conveyor.autoscaler", "conveyor.cli",
         "conveyor.scheduler")


def test_every_name_in_all_is_importable_and_public() -> None:
    assert sorted(conveyor.__all__) == sorted(set(conveyor.__all__))
    for name in conveyor.__all__:
        assert getattr(conveyor, name) is not None, name


def test_task_is_the_decorator_not_a_module() -> None:
    @task(name="tests.public_api.double", queue="q")
    def double(x: int) -> int:
        return 2 * x

    assert isinstance(double, Task)
    assert double(4) == 8
    assert double.message([4]).queue == "q"
    assert conveyor.task is task and callable(conveyor.task)


def test_the_readme_names_come_from_the_package() -> None:
    assert DAG("public_api_dag").dag_id == "public_api_dag"
    assert issubclass(Retry, conveyor.ConveyorError)
    assert Client.__module__ == "conveyor.client"


def test_import_conveyor_stays_light() -> None:
    probe = ("import sys, conveyor; print(' '.join(sorted(m for m in sys.modules if any("
             f"m == h or m.startswith(h + '.') for h in {HEAVY!r}))))")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                            text=True).stdout.split()
    assert loaded == [], f"`import conveyor` loads {loaded}: import them where they are used"


def test_a_canvas_enqueued_in_a_fresh_process_imports_the_scheduler_then(
        tmp_path: Path) -> None:
    probe = ("import sys, conveyor\n"
             "assert 'conveyor.scheduler' not in sys.modules\n"
             "@conveyor.task(name='public_api.add')\n"
             "def add(x, y):\n    return x + y\n"
             f"handle = conveyor.chain(add.s(1, 2), add.s(3)).enqueue("
             f"state_url='sqlite:///{tmp_path}/state.db', "
             f"broker_url='sqlite:///{tmp_path}/broker.db')\n"
             "print(type(handle).__module__, handle.status())")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == ["conveyor.scheduler.canvas", "queued"]


def test_the_scheduler_names_are_imported_on_first_use() -> None:
    assert conveyor.TriggerRule.ALL_DONE == "all_done"
    assert conveyor.Deadline.__module__ == "conveyor.scheduler.alerts"
    with pytest.raises(AttributeError, match="module 'conveyor' has no attribute 'Nope'"):
        _ = conveyor.Nope  # type: ignore[attr-defined]


def test_a_dag_with_a_schedule_still_checks_it() -> None:
    with pytest.raises(conveyor.DagError, match="not a cron expression"):
        DAG("public_api_bad_cron", schedule="every day")
