"""The worker end to end: real `conveyor worker` processes, real brokers, real runners."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import Broker, Depth
from conveyor.message import Codec, Message
from conveyor.worker import sentinel
from tests.integration.workerkit import (
    enqueue,
    events,
    finish,
    open_broker,
    read_ticks,
    start_worker,
    stop,
    stop_cold,
    task_message,
    wait_event,
    worker_env,
)
from tests.support import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/broker.db"


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[Broker]:
    b = open_broker(sqlite_url)
    yield b
    b.close()


@pytest.fixture
def q(unique: str) -> str:
    return f"w-{unique}"


def test_runs_a_task_and_reports_its_result(broker: Broker, sqlite_url: str, q: str) -> None:
    enqueue(broker, task_message("t.add", q, 2, 3, reply_to=q + "-r"))
    out = finish(start_worker(sqlite_url, q, "--concurrency=2"))
    kinds = [(e.kind, e.result) for e in events(broker, q + "-r")]
    assert kinds == [("started", None), ("succeeded", 5)], out
    assert broker.depth(q) == Depth(0, 0, 0, 0)


def test_command_workload_is_execd(broker: Broker, sqlite_url: str, q: str,
                                   tmp_path: Path) -> None:
    target = tmp_path / "touched"
    enqueue(broker, Message(queue=q, command=("touch", str(target)), reply_to=q + "-r"))
    enqueue(broker, Message(queue=q, command=("false",), reply_to=q + "-r", max_retries=0))
    out = finish(start_worker(sqlite_url, q))
    assert target.exists(), out
    kinds = sorted(e.kind for e in events(broker, q + "-r")
                   if e.kind not in ("started", "heartbeat"))  # a heartbeat: a slow run
    assert kinds == ["dead_lettered", "failed", "succeeded"], out
    [dead] = broker.dead_letters(q)
    assert "exited with code 1" in dead.reason


def test_a_command_task_finds_its_context_in_its_environment(
        broker: Broker, sqlite_url: str, q: str, tmp_path: Path) -> None:
    out_file = tmp_path / "env"
    headers = {"run": "r-1", "dag": "revenue", "task_id": "report", "conf": '{"day": "d"}',
               "logical_date": "2026-11-23T03:00:00.000+00:00"}
    message = Message(queue=q, command=("sh", "-c", f"env > {out_file}"), attempt=2,
                      reply_to=q + "-r", headers=headers)
    enqueue(broker, message)
    out = finish(start_worker(sqlite_url, q))
    seen = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line)
    assert {k: v for k, v in seen.items() if k.startswith("CONVEYOR_CTX_")} == {
        "CONVEYOR_CTX_RUN_ID": "r-1", "CONVEYOR_CTX_DAG_ID": "revenue",
        "CONVEYOR_CTX_TASK_ID": "report", "CONVEYOR_CTX_ATTEMPT": "2",
        "CONVEYOR_CTX_LOGICAL_DATE": "2026-11-23T03:00:00.000+00:00",
        "CONVEYOR_CTX_QUEUE": q, "CONVEYOR_CTX_MESSAGE_ID": message.id,
        "CONVEYOR_CTX_CONF": '{"day": "d"}', "CONVEYOR_CTX_MAP_INDEX": "-1"}, out
    assert not any("BROKER" in k or "SIGNING" in k for k in seen), seen  # still scrubbed


def test_oom_task_dies_alone_and_is_dead_lettered(broker: Broker, sqlite_url: str,
                                                  q: str) -> None:
    """Scenario 1 and 2: the hog is killed in its own cgroup, its sibling finishes, the
    supervisor survives, and after its budget the hog sits in the dead letters."""
    enqueue(broker, task_message("t.hog", q, 160, reply_to=q + "-r"))
    enqueue(broker, task_message("t.sleep", q, 1.0, reply_to=q + "-r"))
    worker = start_worker(sqlite_url, q, "--concurrency=2")
    pid = worker.pid
    out = finish(worker, timeout=90)
    assert worker.returncode == 0 and worker.pid == pid, out
    seen = [e for e in events(broker, q + "-r")]
    assert [e.attempt for e in seen if e.kind == "oom_killed"] == [1, 2, 3], out
    assert any(e.kind == "succeeded" and e.result == "slept" for e in seen), out
    [dead] = broker.dead_letters(q)
    assert dead.reason.startswith("oom_killed"), dead.reason
    body = Codec().decode(dead.body)  # no stale count of its own beside the broker's
    assert b'"deliveries"' not in dead.body and body.attempt == dead.delivery_count == 3
    assert broker.depth(q) == Depth(0, 0, 0, 1)


def test_failures_retry_then_dead_letter(broker: Broker, sqlite_url: str, q: str) -> None:
    enqueue(broker, task_message("t.fail", q, "kaput", reply_to=q + "-r"))
    out = finish(start_worker(sqlite_url, q))
    failed = [e for e in events(broker, q + "-r") if e.kind == "failed"]
    assert [e.attempt for e in failed] == [1, 2], out
    assert failed[0].error["type"] == "ValueError" and "kaput" in failed[0].error["traceback"]
    assert failed[0].retry_in > 0 and failed[1].retry_in == 0
    [dead] = broker.dead_letters(q)
    assert "kaput" in dead.reason and "budget spent" in dead.reason


def test_task_asks_for_a_retry(broker: Broker, sqlite_url: str, q: str,
                               tmp_path: Path) -> None:
    enqueue(broker, task_message("t.retry_once", q, str(tmp_path / "m"), reply_to=q + "-r"))
    finish(start_worker(sqlite_url, q))
    final = [e for e in events(broker, q + "-r") if e.kind == "succeeded"]
    assert [(e.attempt, e.result) for e in final] == [(2, "second time")]


def test_hard_and_soft_time_limits(broker: Broker, sqlite_url: str, q: str) -> None:
    enqueue(broker, task_message("t.sleep", q, 30, reply_to=q + "-r", time_limit=1.0,
                                 max_retries=0))
    enqueue(broker, task_message("t.soft", q, 30, reply_to=q + "-r", soft_time_limit=0.5))
    started = time.monotonic()
    out = finish(start_worker(sqlite_url, q, "--concurrency=2"))
    assert time.monotonic() - started < 20, out
    seen = {e.task: e for e in events(broker, q + "-r") if e.kind not in ("started",
                                                                           "heartbeat")}
    assert seen["t.sleep"].kind in ("timed_out", "dead_lettered"), out
    assert seen["t.soft"].kind == "succeeded" and seen["t.soft"].result == "cleaned up"
    [dead] = broker.dead_letters(q)
    assert dead.reason.startswith("timed_out")


def test_time_limits_reach_the_task_on_time(broker: Broker, sqlite_url: str, q: str,
                                            tmp_path: Path) -> None:
    """Each limit reaches the task within a second or two (generous: the machine is shared;
    the figures at p50/p99 are benchmarks/time_limit_precision.py's), and the logged
    duration is the task's: its runner's exit, not when the loop got to it."""
    ticks = tmp_path / "ticks"
    enqueue(broker, task_message("t.tick", q, str(ticks), 60, soft_time_limit=1.0,
                                 time_limit=2.0, max_retries=0))
    out = finish(start_worker(sqlite_url, q))
    record = read_ticks(ticks)
    assert record is not None and record.soft is not None, out
    assert 1.0 - 0.1 <= record.soft - record.started < 2.0, out
    assert 2.0 - 0.1 <= record.lasted < 4.0, out
    [took] = re.findall(r"timed_out in ([0-9.]+)s", out)
    assert 2.0 <= float(took) < 4.0, out


@pytest.mark.parametrize("raw, reason", [
    (b"\x80\x03pickled", "not JSON"),
    (b'{"v": 1, "id": "x"}', "missing the field"),
    (b"{" + b" " * 2_000_000 + b"}", "byte cap"),
], ids=["pickle", "missing-field", "oversized"])
def test_bad_input_is_dead_lettered_and_the_worker_goes_on(broker: Broker, sqlite_url: str,
                                                           q: str, raw: bytes,
                                                           reason: str) -> None:
    broker.publish(q, raw)
    enqueue(broker, task_message("t.add", q, 1, 1, reply_to=q + "-r"))
    out = finish(start_worker(sqlite_url, q))
    [dead] = broker.dead_letters(q)
    assert reason in dead.reason and dead.body == raw, out
    assert [e.result for e in events(broker, q + "-r") if e.kind == "succeeded"] == [2]


def test_unknown_task_is_dead_lettered(broker: Broker, sqlite_url: str, q: str) -> None:
    enqueue(broker, task_message("t.nope", q, reply_to=q + "-r"))
    finish(start_worker(sqlite_url, q))
    [dead] = broker.dead_letters(q)
    assert "unknown task 't.nope'" in dead.reason
    assert [e.kind for e in events(broker, q + "-r")] == ["dead_lettered"]


def test_signing_rejects_unsigned_and_tampered(broker: Broker, sqlite_url: str,
                                               q: str) -> None:
    signed = Codec(signing_key="s3cret")
    enqueue(broker, task_message("t.add", q, 1, 2))  # unsigned
    body = signed.encode(task_message("t.add", q, 1, 2))
    broker.publish(q, body.replace(b'"args":[1,2]', b'"args":[9,9]'))  # tampered
    enqueue(broker, task_message("t.add", q, 2, 2, reply_to=q + "-r"), codec=signed)
    env = worker_env(sqlite_url, CONVEYOR_SIGNING_KEY="s3cret")
    out = finish(start_worker(sqlite_url, q, env=env))
    reasons = sorted(d.reason for d in broker.dead_letters(q))
    assert len(reasons) == 2, out
    assert "unsigned" in reasons[0] and "signature does not match" in reasons[1]
    assert [e.result for e in events(broker, q + "-r") if e.kind == "succeeded"] == [4]


def test_runner_environment_holds_no_secrets(broker: Broker, sqlite_url: str,
                                             q: str) -> None:
    enqueue(broker, task_message("t.env", q, reply_to=q + "-r"), codec=Codec("s3cret"))
    env = worker_env(sqlite_url, CONVEYOR_SIGNING_KEY="s3cret", DATABASE_URL="postgresql://x",
                     API_TOKEN="tok")
    finish(start_worker(sqlite_url, q, env=env))
    [done] = [e for e in events(broker, q + "-r") if e.kind == "succeeded"]
    leaked = [k for k in done.result["environ"] if k.startswith("CONVEYOR_")
              or k in ("DATABASE_URL", "API_TOKEN")]
    assert leaked == []
    assert "s3cret" not in done.result["proc_environ"]
    assert "sqlite:" not in done.result["proc_environ"]


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_siblings_cannot_read_each_other(broker: Broker, sqlite_url: str, q: str,
                                         tmp_path: Path) -> None:
    """Scenario 8: runners as uid 65534 cannot read a sibling runner's environ or memory,
    while the same read of a dumpable process of that uid succeeds."""
    shared = Path(tempfile.mkdtemp(prefix="conveyor-sib-"))  # pytest's tmp is root-only
    shared.chmod(0o777)
    victim_pid = shared / "victim.pid"
    # started as 65534 by exec (not setuid after start, which would make it non-dumpable)
    control = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    try:
        enqueue(broker, task_message("t.wait_for_file", q, str(victim_pid), f"{victim_pid}.read"))
        enqueue(broker, task_message("t.spy", q, str(victim_pid), control.pid,
                                     reply_to=q + "-r"))
        out = finish(start_worker(sqlite_url, q, "--concurrency=2", "--uid=65534",
                                  "--gid=65534"))
    finally:
        control.kill()
        control.wait()
        shutil.rmtree(shared)
    [spied] = [e.result for e in events(broker, q + "-r") if e.kind == "succeeded"]
    assert spied == {"victim_environ": "PermissionError", "victim_mem": "PermissionError",
                     "control_environ": "readable"}, out


def test_sigterm_drains_running_tasks_and_fetches_nothing_new(broker: Broker,
                                                              sqlite_url: str, q: str) -> None:
    enqueue(broker, task_message("t.sleep", q, 1.5, reply_to=q + "-r"))
    worker = start_worker(sqlite_url, q, "--concurrency=1", burst=False)
    wait_event(broker, q + "-r", "started")
    enqueue(broker, task_message("t.add", q, 1, 1, reply_to=q + "-r"))
    stop(worker)
    out = finish(worker)
    assert worker.returncode == 0, out
    kinds = [e.kind for e in events(broker, q + "-r")]
    assert "succeeded" in kinds and "started" not in kinds, out
    assert broker.depth(q).ready == 1


def test_drain_timeout_requeues_without_spending_retries(broker: Broker, sqlite_url: str,
                                                         q: str) -> None:
    enqueue(broker, task_message("t.sleep", q, 60, reply_to=q + "-r", max_retries=0))
    worker = start_worker(sqlite_url, q, "--drain-timeout=1", burst=False)
    wait_event(broker, q + "-r", "started")
    stop(worker)
    out = finish(worker, timeout=30)
    assert worker.returncode == 0, out
    assert "interrupted" in [e.kind for e in events(broker, q + "-r")], out
    assert "killed and requeued: the drain timeout (1 s) passed" in out, out
    assert broker.depth(q) == Depth(1, 0, 0, 0)
    [delivery] = [d for d in [next(broker.consume([q], timeout=1))] if d]
    assert Codec().decode(delivery.body).attempt == 1 and delivery.delivery_count == 2


def test_a_drain_gives_back_a_task_still_waiting_for_a_runner(broker: Broker,
                                                              sqlite_url: str, q: str) -> None:
    """A delivery accepted while its slot had no runner yet never started: a drain gives it
    back at once. (The worker used to wait for it to start, which a drain forbids: hung.)
    The lane is stopped after forking its two runners ahead, so the third task waits."""
    worker = start_worker(sqlite_url, q, "--concurrency=1", burst=False)
    try:
        lane = wait_for(lambda: _lane_with_runners(worker.pid, 2), 30,
                        "the lane's two runners forked ahead")
        os.kill(lane, signal.SIGSTOP)  # it forks no third runner
        for _ in range(3):
            enqueue(broker, task_message("t.add", q, 1, 1, reply_to=q + "-r"))
        wait_event(broker, q + "-r", "succeeded")
        wait_event(broker, q + "-r", "succeeded")
        wait_for(lambda: broker.depth(q) == Depth(0, 1, 0, 0), 30,
                 "the third task taken, waiting for a runner")
        stop(worker)
        out = finish(worker, timeout=20)
    finally:
        stop(worker, signal.SIGKILL)
    assert worker.returncode == 0, out
    assert "started" not in [e.kind for e in events(broker, q + "-r")], out
    assert broker.depth(q) == Depth(1, 0, 0, 0)


def test_a_killed_worker_with_a_stopped_lane_leaves_no_zygote_behind(sqlite_url: str,
                                                                     q: str) -> None:
    """The zygote waits for its lanes once its worker is gone, but not for ever: a lane
    that cannot act (stopped here) is killed after LANE_GRACE, and the zygote exits. (It
    waited for ever: a zygote and its stopped lane outlived a worker a failed test killed.)"""
    worker = start_worker(sqlite_url, q, "--concurrency=1", burst=False)
    try:
        lane = wait_for(lambda: _lane_with_runners(worker.pid, 2), 30,
                        "the lane's two runners forked ahead")
        [zygote] = _children(worker.pid)
        os.kill(lane, signal.SIGSTOP)
    finally:
        stop(worker, signal.SIGKILL)
        finish(worker, timeout=30)
    gone = wait_for(lambda: not _alive(zygote) and not _alive(lane), 30,
                    "the zygote and its stopped lane to exit")
    assert gone


def _alive(pid: int) -> bool:
    """Whether `pid` still exists and is not a zombie (its parent may be init here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_worker_that_cannot_start_leaves_no_zygote_behind(sqlite_url: str, q: str) -> None:
    """The zygote is started first thing, beside the apps' import: when the worker then
    fails (an --app that does not import), it stops the zygote too."""
    missing = f"missing_{q.replace('-', '_')}"
    worker = start_worker(sqlite_url, q, f"--app={missing}")
    out = finish(worker, timeout=30)
    assert worker.returncode != 0 and f"cannot import --app module {missing!r}" in out, out
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and missing.encode() in _cmdline(p)], "a zygote outlived its worker"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _lane_with_runners(worker: int, count: int) -> int | None:
    """The pid of the worker's only lane once it has `count` children (its runners) and is
    back asleep in its poll: a lane forks a runner, then tells the supervisor of it, so a
    lane stopped between the two (seen at a load average of 5) hides a runner."""
    [zygote] = _children(worker) or [0]
    lanes = [p for p in _children(zygote) if _comm(p) != sentinel.NAME] if zygote else []
    if len(lanes) != 1 or len(_children(lanes[0])) != count:
        return None
    if not _asleep(lanes[0]):
        return None
    time.sleep(0.05)
    return lanes[0] if _asleep(lanes[0]) else None


def _asleep(pid: int) -> bool:
    """Whether `pid` is sleeping (state S in /proc/<pid>/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "S"
    except (OSError, IndexError):
        return False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_second_signal_is_a_cold_shutdown(broker: Broker, sqlite_url: str, q: str) -> None:
    enqueue(broker, task_message("t.sleep", q, 60, reply_to=q + "-r"))
    worker = start_worker(sqlite_url, q, "--drain-timeout=60", burst=False)
    wait_event(broker, q + "-r", "started")
    before = stop_cold(worker, signal.SIGTERM, signal.SIGINT)
    started = time.monotonic()
    out = before + finish(worker, timeout=30)
    assert time.monotonic() - started < 10, out
    assert broker.depth(q).ready == 1
    assert "killed and requeued: cold stop: a second stop signal" in out, out
    assert "drain timeout" not in out.split("cold shutdown")[-1], out


def test_what_a_task_leaves_behind_is_killed(broker: Broker, sqlite_url: str, q: str,
                                             tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    enqueue(broker, task_message("t.orphan", q, str(pid_file), reply_to=q + "-r"))
    worker = start_worker(sqlite_url, q, burst=False)
    try:
        wait_event(broker, q + "-r", "succeeded")
        _wait_gone(int(pid_file.read_text()), timeout=5)
    finally:
        stop(worker)
        finish(worker)


def test_kill_9_of_a_worker_mid_task_loses_nothing(any_broker_url: str, q: str,
                                                   tmp_path: Path) -> None:
    broker = open_broker(any_broker_url)
    weaker = getattr(broker, "unsupported", {}).get("crash_redelivery")
    if weaker:
        broker.close()
        pytest.skip(f"not supported by {type(broker).__name__}: {weaker}")
    log = tmp_path / "log"
    try:
        enqueue(broker, task_message("t.hang_once", q, str(log), "A", reply_to=q + "-r"))
        doomed = start_worker(any_broker_url, q, burst=False)
        wait_event(broker, q + "-r", "started")
        runner_pid = _wait_started(log)
        doomed.kill()
        finish(doomed)
        _wait_gone(runner_pid)
        enqueue(broker, task_message("t.record", q, str(log), "B", 0, reply_to=q + "-r"))
        survivor = start_worker(any_broker_url, q, "--time-limit=60", "--concurrency=2")
        out = finish(survivor, timeout=90)
        lines = log.read_text().splitlines()
        assert "done A" in lines and "done B" in lines, out
        assert broker.depth(q).active == 0
    finally:
        broker.purge(q)
        broker.purge(q + "-r")
        broker.close()


def _wait_started(log: Path, timeout: float = 10) -> int:
    """The runner's pid once the task body has begun (it logs `start A <pid>`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count("\n"):
            return int(log.read_text().split()[2])
        time.sleep(0.02)
    raise AssertionError("the task never started")


def _wait_gone(pid: int, timeout: float = 10) -> None:
    """The runner dies with its worker (parent-death signal); nothing is left behind.

    A dead process whose new parent has not reaped it yet is a zombie: gone for our
    purposes (it runs nothing and holds no memory).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    status = Path(f"/proc/{pid}/status").read_text()
    raise AssertionError(f"runner {pid} outlived its killed worker:\n{status[:600]}")


def test_a_burst_of_stop_signals_stops_it_cold_never_hangs(broker: Broker, sqlite_url: str,
                                                           q: str, tmp_path: Path) -> None:
    """Signals arriving while an earlier one is being handled (a held-down Ctrl-C, a
    supervisor sending SIGTERM twice): the handlers take no lock, so none waits for itself
    (one that woke the broker from the handler once hung the worker for good)."""
    marker = tmp_path / "started"
    enqueue(broker, task_message("t.sleep", q, 60, str(marker)))
    worker = start_worker(sqlite_url, q, "--drain-timeout=60", burst=False)
    try:
        wait_for(marker.exists, 60, "the task to start")
        for _ in range(100):   # spaced: signals sent at once coalesce into one
            worker.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        out = finish(worker, 30)
    finally:
        stop(worker, signal.SIGKILL)
    assert "cold shutdown" in out and worker.returncode is not None, out
