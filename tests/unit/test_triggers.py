"""Triggers described, rebuilt and refused (conveyor/triggers), a task's Defer as its runner
reports it and its worker settles it, without a triggerer (tests/integration/test_triggerer.py
runs them for real)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.tasks import Defer
from conveyor.triggers import (
    DelayTrigger,
    FileTrigger,
    HttpTrigger,
    SqlTrigger,
    TimeTrigger,
    Trigger,
    TriggerError,
    load,
)
from conveyor.worker.outcome import Budget, Facts, classify, decide, outside_dag
from conveyor.worker.runner import _deferral
from tests.support import run_coroutine

CLEAN_EXIT = 0


@dataclass
class Holding(Trigger):
    """A trigger whose field is not a JSON value."""

    what: object


def test_a_trigger_is_described_by_its_class_path_and_fields_and_rebuilt_from_them() -> None:
    classpath, kwargs = FileTrigger("/data/in.csv", poll_interval=0.2).serialize()
    assert classpath == "conveyor.triggers.builtin:FileTrigger"
    assert load(classpath, kwargs) == FileTrigger("/data/in.csv", 0.2)


def test_a_delay_is_stored_as_the_time_it_ends() -> None:
    before = time.time()
    classpath, kwargs = DelayTrigger(30).serialize()
    assert classpath.endswith(":TimeTrigger") and before + 30 <= kwargs["at"] <= time.time() + 30


def test_what_cannot_be_described_or_loaded_is_refused_saying_why() -> None:
    @dataclass
    class Local(Trigger):
        n: int

    with pytest.raises(TriggerError, match="defined in a function"):
        Local(1).serialize()
    with pytest.raises(TriggerError, match="JSON values"):
        Holding(object()).serialize()
    with pytest.raises(TriggerError, match="cannot be imported in the triggerer"):
        load("nowhere.at_all:Gone", {})
    with pytest.raises(TriggerError, match="not a conveyor.triggers.Trigger"):
        load("os:getcwd", {})
    with pytest.raises(TriggerError, match="cannot be built"):
        load("conveyor.triggers.builtin:FileTrigger", {"nope": 1})


def test_time_and_file_triggers_fire_with_their_payloads(tmp_path: Path) -> None:
    fired = run_coroutine(TimeTrigger(time.time() - 1).run())
    assert fired["fired_at"] >= fired["at"]
    path = tmp_path / "landed"
    path.write_text("abc")
    payload = run_coroutine(FileTrigger(str(path)).run())
    assert payload == {"path": str(path), "size": 3, "mtime": os.stat(path).st_mtime}


def test_a_deferral_is_reported_with_its_trigger_and_acked_for_the_scheduler() -> None:
    report = _deferral(Defer(FileTrigger("/x"), timeout=60))
    assert report["deferral"] == {"classpath": "conveyor.triggers.builtin:FileTrigger",
                                  "kwargs": {"path": "/x", "poll_interval": 0.5},
                                  "timeout": 60}
    outcome = classify(Facts(report, CLEAN_EXIT))
    assert outcome.kind == "deferred" and outcome.result == report["deferral"]
    assert decide(outcome, 1, Budget(), report_only=True).verb == "ack"


def test_a_deferral_that_cannot_be_described_fails_the_task() -> None:
    assert _deferral(Defer("a file, please"))["outcome"] == "failed"
    assert _deferral(Defer(Holding(object())))["error"]["type"] == "TriggerError"


def test_a_task_outside_a_dag_that_defers_fails_saying_what_to_do() -> None:
    failed = outside_dag(classify(Facts(_deferral(Defer(FileTrigger("/x"))), CLEAN_EXIT)))
    assert failed.kind == "failed" and "Defer is for DAG tasks" in failed.reason


def test_file_triggers_share_one_poller_and_a_cancelled_one_leaves_nothing(
        tmp_path: Path) -> None:
    from conveyor.triggers.builtin import _Poller

    async def scenario() -> tuple[list[dict[str, object]], int]:
        later = tmp_path / "later"
        waits = [asyncio.create_task(FileTrigger(str(later), 0.01).run()) for _ in range(3)]
        gone = asyncio.create_task(FileTrigger(str(tmp_path / "never"), 0.01).run())
        await asyncio.sleep(0.05)
        gone.cancel()
        later.write_text("ok")
        fired = await asyncio.gather(*waits)
        await asyncio.gather(gone, return_exceptions=True)
        return fired, len(_Poller.of(0.01).waiting)

    fired, left = run_coroutine(scenario())
    assert [f["size"] for f in fired] == [2, 2, 2] and left == 0


def test_an_http_trigger_fires_once_the_endpoint_answers_as_expected() -> None:
    import http.server
    import threading

    answers = iter([503, 200, 200])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - the stdlib's name
            status = next(answers)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ready" if status == 200 else b"not yet")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/health"
        fired = run_coroutine(HttpTrigger(url, contains="ready", poll_interval=0.01).run())
    finally:
        server.shutdown()
        server.server_close()
    assert fired == {"url": url, "status": 200, "body": "ready"}


def test_a_sql_trigger_fires_once_its_query_returns_rows(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE batches (id INTEGER, done INTEGER)")
        conn.execute("INSERT INTO batches VALUES (1, 0)")

    async def scenario() -> dict[str, object]:
        waiting = asyncio.create_task(SqlTrigger(
            f"sqlite:///{db}", "SELECT id FROM batches WHERE done = 1", 0.01).run())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE batches SET done = 1")
        return await waiting

    assert run_coroutine(scenario()) == {"rows": [[1]]}
