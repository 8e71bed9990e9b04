"""Log lines: human or JSON, with the task's ids as fields on every line about a task."""

from __future__ import annotations

import json
import logging
import time

import pytest

from conveyor import logs
from conveyor.message import Message
from conveyor.scheduler import DAG
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store
from tests.support import RecordingExecutor


def record(message: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("conveyor.worker", logging.WARNING, __file__, 1, message, (), None)
    rec.__dict__.update(extra)
    return rec


def test_json_lines_lift_task_ids_from_the_supervisors_words() -> None:
    line = logs.JsonFormatter().format(record(
        "task=revenue.extract_payments id=01ABC attempt=2 run=01RUN/2 failed in 0.03s"))
    doc = json.loads(line)
    assert (doc["task"], doc["message_id"], doc["attempt"], doc["run_id"]) == (
        "revenue.extract_payments", "01ABC", 2, "01RUN/2")
    assert doc["level"] == "WARNING" and doc["logger"] == "conveyor.worker"


def test_extra_fields_win_and_other_lines_carry_no_task_fields() -> None:
    doc = json.loads(logs.JsonFormatter().format(record("x task=a", task="b", attempt=3)))
    assert (doc["task"], doc["attempt"]) == ("b", 3)
    plain = json.loads(logs.JsonFormatter().format(record("worker stopped")))
    assert set(plain) == {"at", "level", "logger", "message"}


def test_log_format_names_what_is_allowed() -> None:
    assert logs.log_format("json") == "json"
    with pytest.raises(ValueError, match="human, json"):
        logs.log_format("xml")


def test_a_dag_tasks_log_words_name_the_run_that_runs_list_shows(store: Store) -> None:
    """`run=` is what `conveyor runs show` takes: grep a worker's log for a run id found."""
    dag = DAG("revenue")
    dag.command("report", ["true"])
    dag.validate()
    run_id = create_run(store, dag, time.time(), executors=["queue"])
    executor = RecordingExecutor()
    Engine(store, {"queue": executor}, dags={"revenue": dag}).tick(time.time())
    message = executor.sent[0].message
    assert message.log_words == f"task=true id={message.id} attempt=1 run={run_id}"
    plain = Message(queue="default", task="billing.tasks.extract_orders")
    assert plain.log_words == f"task=billing.tasks.extract_orders id={plain.id} attempt=1"
