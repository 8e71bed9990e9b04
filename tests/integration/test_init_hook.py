"""`worker_process_init`: once per runner process, in that process, failures reported."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conveyor.broker import Broker
from tests.integration.workerkit import (
    enqueue,
    events,
    finish,
    open_broker,
    start_worker,
    task_message,
    worker_env,
)

pytestmark = pytest.mark.slow
APP = "--app=tests.integration.init_hook_tasks"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/broker.db"


@pytest.fixture
def broker(sqlite_url: str) -> Broker:
    b = open_broker(sqlite_url)
    yield b  # type: ignore[misc]
    b.close()


def _run(broker: Broker, url: str, q: str, n: int, tmp_path: Path, *flags: str,
         **env: str) -> tuple[list[dict[str, int]], list[int], str]:
    log = tmp_path / "inits"
    log.touch()
    for _ in range(n):
        enqueue(broker, task_message("t.init_pids", q, reply_to=q + "-r", max_retries=0))
    out = finish(start_worker(url, q, APP, "--concurrency=2", *flags,
                              env=worker_env(url, INIT_HOOK_LOG=str(log), **env)))
    results = [e.result for e in events(broker, q + "-r") if e.kind == "succeeded"]
    return results, [int(line) for line in log.read_text().split()], out


def test_hook_runs_once_in_each_fresh_runner_before_its_task(
        broker: Broker, sqlite_url: str, unique: str, tmp_path: Path) -> None:
    results, inits, out = _run(broker, sqlite_url, f"ih-{unique}", 4, tmp_path)
    assert len(results) == 4, out
    assert all(r["opened_in"] == r["pid"] for r in results), results  # in the task's process
    assert len({r["pid"] for r in results}) == 4, results  # a fresh runner per task
    assert max(Counter(inits).values()) == 1, inits  # once per process
    assert {r["pid"] for r in results} <= set(inits)


def test_hook_runs_once_per_process_when_runners_are_reused(
        broker: Broker, sqlite_url: str, unique: str, tmp_path: Path) -> None:
    results, inits, out = _run(broker, sqlite_url, f"ih-{unique}", 6, tmp_path,
                               "--max-tasks-per-child=3")
    assert len(results) == 6, out
    assert all(r["opened_in"] == r["pid"] for r in results), results
    assert max(Counter(inits).values()) == 1, inits
    assert len({r["pid"] for r in results}) < 6, results  # some runner ran several tasks


def test_a_failing_hook_fails_the_task_with_a_clear_reason(
        broker: Broker, sqlite_url: str, unique: str, tmp_path: Path) -> None:
    q = f"ih-{unique}"
    _results, _inits, out = _run(broker, sqlite_url, q, 1, tmp_path, INIT_HOOK_FAIL="1")
    [dead] = broker.dead_letters(q)
    assert "worker_process_init hook tests.integration.init_hook_tasks.open_resources " \
           "failed in runner" in dead.reason, out
    assert "RuntimeError: the database is not there" in dead.reason, out
