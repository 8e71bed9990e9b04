"""Follow-ups: a task enqueues, and its worker publishes on the broker it serves (issue 27).

A runner holds none of the worker's settings, so these run real workers on each transport
and check that what a task enqueues runs there, that the runner's environment still holds
no CONVEYOR_* variable and no URL, and that nothing lands in the task user's embedded SQLite
file (where the follow-ups used to go, never to run).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conveyor.broker import Depth
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.message import Codec, Message
from tests.integration.private_servers import PrivateServer, free_port, with_options
from tests.integration.workerkit import (
    enqueue,
    events,
    finish,
    open_broker,
    start_worker,
    task_message,
    wait_event,
    worker_env,
)
from tests.support import wait_for

pytestmark = pytest.mark.slow



@pytest.fixture
def q(unique: str) -> str:
    return f"fu-{unique}"


def embedded_default(home: Path) -> Path:
    """Where a client that fell back to its defaults would have written (HOME=home)."""
    return home / ".local/share/conveyor/conveyor.db"


def test_a_follow_up_runs_on_the_broker_the_worker_serves(any_broker_url: str, q: str,
                                                           tmp_path: Path) -> None:
    broker, home = open_broker(any_broker_url), tmp_path / "home"
    try:
        enqueue(broker, task_message("t.follow_up", q, 41, 1, q + "-r", reply_to=q + "-r"))
        out = finish(start_worker(any_broker_url, q, "--concurrency=2",
                                  env=worker_env(any_broker_url, HOME=str(home))), timeout=90)
        seen = list(events(broker, q + "-r", timeout=2))
        [parent] = [e for e in seen if e.kind == "succeeded" and e.task == "t.follow_up"]
        [child] = [e for e in seen if e.kind == "succeeded" and e.task == "t.add"]
        assert child.message_id == parent.result["id"] and child.result == 42, out
        assert parent.result["leaked"] == []
        assert not embedded_default(home).exists()
        assert broker.depth(q).active == 0
    finally:
        broker.purge(q)
        broker.purge(q + "-r")
        broker.close()


def test_a_follow_up_of_a_worker_on_the_embedded_default_of_its_home(q: str,
                                                                     tmp_path: Path) -> None:
    """The issue's own case: `CONVEYOR_HOME=X conveyor worker`, no broker URL. The runner's
    environment has no CONVEYOR_HOME, so a client in it meant the task user's default."""
    data, home = tmp_path / "data", tmp_path / "home"
    url = f"sqlite:///{data}/conveyor.db"
    data.mkdir()
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.follow_up", q, 41, 1, q + "-r", reply_to=q + "-r"))
        env = worker_env(url, CONVEYOR_HOME=str(data), HOME=str(home))
        del env["CONVEYOR_BROKER_URL"]
        out = finish(start_worker(url, q, env=env))
        added = [e.result for e in events(broker, q + "-r")
                 if e.kind == "succeeded" and e.task == "t.add"]
        assert added == [42], out
        assert not embedded_default(home).exists()
    finally:
        broker.close()


def test_every_producer_api_of_a_task_reaches_its_worker_signed(q: str,
                                                                 tmp_path: Path) -> None:
    """task.enqueue, default_client(), Client.from_settings without a URL: through the
    worker, signed with its key (a task has none), on a runner reused for both tasks; a
    client given a URL of its own still publishes there; a result cannot be awaited, and a
    broker opened without a URL is refused rather than the embedded default."""
    url, other_url = f"sqlite:///{tmp_path}/broker.db", f"sqlite:///{tmp_path}/other.db"
    home, codec = tmp_path / "home", Codec("s3cret")
    broker, other = open_broker(url), open_broker(other_url)
    try:
        for _ in range(2):
            enqueue(broker, task_message("t.follow_ups_every_way", q, q + "-r", other_url,
                                         reply_to=q + "-r"), codec=codec)
        env = worker_env(url, HOME=str(home), CONVEYOR_SIGNING_KEY="s3cret")
        out = finish(start_worker(url, f"{q},default", "--concurrency=1",
                                  "--max-tasks-per-child=8", env=env), timeout=90)
        seen = list(events(broker, q + "-r", timeout=2))
        parents = [e.result for e in seen if e.kind == "succeeded"
                   and e.task == "t.follow_ups_every_way"]
        assert len(parents) == 2, out
        added = {e.message_id: e.result for e in seen if e.kind == "succeeded"
                 and e.task == "t.add"}
        for ids in parents:
            assert added[ids["default_client"]] == 3 and added[ids["from_settings"]] == 5
            assert "ConveyorError: a task cannot wait for another task's result" in \
                ids["result"]
            assert ids["bare"].startswith("ConfigError: no broker URL inside a task")
        assert parents[0]["pid"] == parents[1]["pid"], "one runner, reused, ran both"
        assert "dead-lettering" not in out and broker.dead_letters(q) == [], out
        stored = Client.from_settings(Settings(broker_url=url)).results()
        for ids in parents:   # task.enqueue: queue "default", result kept, as outside a task
            record = stored.get(ids["task.enqueue"])
            assert record is not None and record.status == "succeeded"
        assert other.depth(q) == Depth(2, 0, 0, 0)   # the explicit URL, untouched by the worker
        assert not embedded_default(home).exists()
    finally:
        broker.close()
        other.close()


def test_a_command_task_that_enqueues_without_a_url_is_refused_in_one_line(
        q: str, tmp_path: Path) -> None:
    """An exec'd command has no channel to its worker: `conveyor enqueue` in it says so
    instead of publishing to the task user's embedded default, where nothing would run it."""
    url, home = f"sqlite:///{tmp_path}/broker.db", tmp_path / "home"
    broker = open_broker(url)
    try:
        enqueue(broker, Message(queue=q, command=(sys.executable, "-m", "conveyor.cli",
                                                  "enqueue", "t.add", "--args", "[1, 2]"),
                                max_retries=0, reply_to=q + "-r"))
        out = finish(start_worker(url, q, env=worker_env(url, HOME=str(home))))
        [failed] = [e for e in events(broker, q + "-r") if e.kind == "failed"]
        said = [line for line in failed.log if line.strip()]
        assert len(said) == 1 and "no broker URL inside a task" in said[0], out
        assert not embedded_default(home).exists()
    finally:
        broker.close()


def test_a_follow_up_the_worker_refuses_raises_in_the_task(q: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.follow_up_refused", q, 4000, reply_to=q + "-r"))
        env = worker_env(url, CONVEYOR_MAX_MESSAGE_BYTES="2000")
        out = finish(start_worker(url, f"{q},default", env=env))
        [done] = [e for e in events(broker, q + "-r") if e.kind == "succeeded"]
        assert done.result.startswith("MessageError: follow-up refused: message ") \
            and "over the 2000-byte cap" in done.result, out
        assert "task=t.follow_up_refused" in out and "follow-up refused" in out
        assert broker.depth("default").ready == 0
    finally:
        broker.close()


def test_a_follow_up_during_an_outage_raises_in_the_task_and_the_worker_goes_on(
        private_redis: PrivateServer, q: str, tmp_path: Path) -> None:
    """The broker goes away while a task runs; its enqueue fails after the URL's retry
    window with a BrokerError in the task, while the worker lives on, logs it and counts
    it."""
    url = with_options(private_redis.url, prefix=q, retry_seconds=1)
    go, out_file, port = tmp_path / "go", tmp_path / "out", free_port()
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.follow_up_when", q, str(go), str(out_file),
                                     reply_to=q + "-r"))
        worker = start_worker(url, q, f"--metrics-port={port}", burst=False)
        wait_event(broker, q + "-r", "started")
        private_redis.stop()
        go.touch()
        deadline = time.monotonic() + 60
        while not out_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = worker.poll() is None
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                         timeout=10).read().decode() if alive else ""
        worker.kill()
        out = finish(worker)
        assert out_file.exists(), out
        took, what = out_file.read_text().split(" ", 1)
        assert what.startswith("BrokerError: the worker could not publish this follow-up"), what
        assert float(took) < 30 and alive, out
        assert 'conveyor_follow_ups_total{outcome="failed",queue="default"} 1.0' in metrics
        assert "task=t.follow_up_when" in out and "could not publish this follow-up" in out
    finally:
        broker.close()


def test_a_soft_time_limit_during_a_follow_ups_wait_leaves_the_next_one_right(
        private_redis: PrivateServer, q: str, tmp_path: Path) -> None:
    """The broker is paused (SIGSTOP) while a task waits for its follow-up: the soft time
    limit still reaches the task, which catches it; the broker comes back, the late answer
    to that first request arrives, and the task's next enqueue gets its own answer."""
    import redis
    url = with_options(private_redis.url, prefix=q)
    files = {name: tmp_path / name for name in ("go", "interrupted", "resume", "out")}
    server = int(redis.Redis(port=private_redis.port).info("server")["process_id"])
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.follow_up_interrupted", q,
                                     *(str(path) for path in files.values()),
                                     reply_to=q + "-r"))
        worker = start_worker(url, f"{q},default", "--soft-time-limit=2", "--time-limit=60",
                              burst=False)
        wait_event(broker, q + "-r", "started")
        os.kill(server, signal.SIGSTOP)
        try:
            files["go"].touch()
            wait_for(files["interrupted"].exists, 30, "the soft time limit in the task")
        finally:
            os.kill(server, signal.SIGCONT)
        files["resume"].touch()
        done = wait_event(broker, q + "-r", "succeeded")
        stored = Client.from_settings(Settings(broker_url=url)).results()
        second_ran = stored.wait(done.result, 30)   # t.add(2, 2), its result kept
        worker.terminate()
        out = finish(worker)
        first, second = files["out"].read_text().split()
        assert first == "interrupted" and done.result == second, out
        assert second_ran is not None and second_ran.unwrap(second) == 4, out
    finally:
        broker.close()
