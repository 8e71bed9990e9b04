"""What travels between a worker and its runners. Messages, results and follow-ups bigger
than one default Unix socket buffer (208 KiB): carried when the host allows
(net.core.wmem_max), and refused in words when not, never looping over runners or vanishing
as a lost runner. And what a task writes to its channel that is not a frame: its runner
dies, the worker goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.client import Client
from conveyor.config import Settings
from conveyor.message import Codec
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

BIG = 300_000   # over the default buffer, under the 1 MiB message and result caps
HUGE = 5 * 1024 * 1024   # over the 4 MiB frame limit: never carried


def host_carries(size: int) -> bool:
    """Whether this host lets an unprivileged socket buffer hold a frame of `size`."""
    return 2 * int(Path("/proc/sys/net/core/wmem_max").read_text()) > size + 4096


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/broker.db"


@pytest.fixture
def q(unique: str) -> str:
    return f"fs-{unique}"


def test_big_messages_results_and_follow_ups_are_carried(url: str, q: str) -> None:
    if not host_carries(2 * BIG):
        pytest.skip("net.core.wmem_max is too small here for 300 kB frames")
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.add", q, "x" * BIG, "y", reply_to=q + "-r"))
        enqueue(broker, task_message("t.echo_big", q, BIG, reply_to=q + "-r"))
        enqueue(broker, task_message("t.follow_up_refused", q, BIG, reply_to=q + "-r"))
        out = finish(start_worker(url, f"{q},default", "--concurrency=1"), timeout=90)
        done = {e.task: e.result for e in events(broker, q + "-r") if e.kind == "succeeded"}
        assert len(done.get("t.add") or "") == BIG + 1, out
        assert len(done.get("t.echo_big") or "") == BIG
        published = done["t.follow_up_refused"]
        assert published.startswith("published "), published
        record = Client.from_settings(Settings(broker_url=url)).results().get(
            published.split()[1])
        assert record is not None and record.status == "succeeded", out
    finally:
        broker.close()


def test_frames_no_runner_can_take_are_refused_in_words(url: str, q: str) -> None:
    """A message over the frame limit is dead-lettered with the reason (it used to make the
    worker hand it to one runner after another, for ever); a result over it fails its task
    saying so (it read as a runner that exited before reporting)."""
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.add", q, "x" * HUGE, "y", reply_to=q + "-r"),
                codec=Codec(max_bytes=2 * HUGE))
        enqueue(broker, task_message("t.echo_big", q, HUGE, reply_to=q + "-r"))
        env = worker_env(url, CONVEYOR_MAX_MESSAGE_BYTES=str(2 * HUGE),
                         CONVEYOR_RESULT_MAX_BYTES=str(2 * HUGE))
        out = finish(start_worker(url, q, "--concurrency=1", env=env), timeout=90)
        reasons = [d.reason for d in broker.dead_letters(q)]
        assert len(reasons) == 2, out   # the message unrun, the failed task (no retries)
        assert any("too large to hand to a runner" in r for r in reasons), reasons
        [failed] = [e for e in events(broker, q + "-r") if e.kind == "failed"]
        assert failed.task == "t.echo_big"
        assert "the task's report is too large for its worker" in failed.reason, out
        assert "could not take" not in out
    finally:
        broker.close()


def test_a_task_that_garbles_its_channel_fails_alone(url: str, q: str) -> None:
    """It used to stop the worker ('the runner watcher stopped: UnicodeDecodeError')."""
    broker = open_broker(url)
    try:
        enqueue(broker, task_message("t.garble_channel", q, reply_to=q + "-r"))
        enqueue(broker, task_message("t.add", q, 1, 2, reply_to=q + "-r"))
        worker = start_worker(url, q, "--concurrency=1")
        out = finish(worker, timeout=60)
        assert worker.returncode == 0, out
        outcomes = {e.task: e for e in events(broker, q + "-r")
                    if e.kind in ("succeeded", "failed")}
        assert outcomes["t.add"].result == 3, out
        assert outcomes["t.garble_channel"].kind == "failed"
        assert "wrote to its runner's channel what is not a frame" in \
            outcomes["t.garble_channel"].reason, out
    finally:
        broker.close()
