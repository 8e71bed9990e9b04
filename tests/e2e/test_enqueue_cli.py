"""`conveyor enqueue` as a user runs it, against a real worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.workerkit import ROOT, finish, start_worker, worker_env


def conveyor(*argv: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "conveyor.cli", *argv], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def enqueue_and_drain(url: str, queue: str, *argv: str) -> tuple[int, str, str, str]:
    """Run `conveyor enqueue … --wait`, then a burst worker once the message is published
    (a burst worker started first could find the queue empty and leave at once): its exit
    code, the stderr line saying what was enqueued, then its stdout and the rest of stderr."""
    waiting = conveyor("enqueue", *argv, "-Q", queue, "--wait", "--timeout", "60",
                       env=worker_env(url))
    try:
        assert waiting.stderr is not None
        sent = waiting.stderr.readline()
        finish(start_worker(url, queue))
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
        waiting.communicate()
    return waiting.returncode, sent, out, err


def test_enqueue_wait_prints_the_return_value_alone(tmp_path: Path, unique: str) -> None:
    code, sent, out, err = enqueue_and_drain(f"sqlite:///{tmp_path}/b.db", unique, "t.add",
                                             "--args", "[20, 22]")
    assert code == 0, (sent, out, err)
    assert out == "42\n"          # `$(conveyor enqueue … --wait)` is the value
    assert sent.startswith("conveyor: enqueued ") and f"on queue {unique!r} (-Q)" in sent


def test_enqueue_wait_fails_for_a_dead_letter(tmp_path: Path, unique: str) -> None:
    code, sent, out, err = enqueue_and_drain(f"sqlite:///{tmp_path}/b.db", unique,
                                             "t.unregistered")
    assert code == 1, (sent, out, err)
    assert out == "" and "dead-lettered: unknown task" in err.splitlines()[-1]


def test_enqueue_wait_fails_for_a_message_that_expired_before_a_worker_came(
        tmp_path: Path, unique: str) -> None:
    code, sent, out, err = enqueue_and_drain(f"sqlite:///{tmp_path}/b.db", unique,
                                             "--expires", "0.05", "t.add", "--args", "[1, 2]")
    assert code == 1, (sent, out, err)
    assert out == "" and "expired: not started by its deadline" in err.splitlines()[-1]


def test_expires_not_after_delay_is_one_readable_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "enqueue", "--delay", "5",
                           "--expires", "2", "t.add"], cwd=ROOT, capture_output=True,
                          text=True, env=worker_env(f"sqlite:///{tmp_path}/b.db"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "conveyor: --expires 2 is not after --delay 5: the message would expire before it "
        "may run"]


def test_bad_json_args_are_one_readable_line(tmp_path: Path) -> None:
    env = worker_env(f"sqlite:///{tmp_path}/b.db")
    proc = conveyor("enqueue", "t.add", "--args", "{oops", env=env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "--args: not JSON" in err


def test_enqueue_with_a_unique_key_publishes_it_once_until_its_outcome(
        tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    argv = ("enqueue", "t.add", "--args", "[1, 2]", "-Q", unique, "--unique-key", "invoice:42")

    def once() -> dict[str, object]:
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], cwd=ROOT,
                              capture_output=True, text=True, env=worker_env(url))
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    first, again = once(), once()
    assert "duplicate" not in first and again == {**first, "duplicate": True}
    finish(start_worker(url, unique))  # the outcome gives the key back
    assert "duplicate" not in once()


def test_enqueue_holds_an_importable_tasks_own_unique_key(tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/b.db"

    def enqueue(invoice: int) -> dict[str, object]:
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", "enqueue",
                               "tests.integration.worker_tasks.send_invoice", "--args",
                               f"[{invoice}]", "-Q", unique], cwd=ROOT, capture_output=True,
                              text=True, env=worker_env(url))
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    first = enqueue(42)
    assert enqueue(42) == {**first, "duplicate": True}
    assert "duplicate" not in enqueue(43)


def test_unique_for_without_a_key_is_one_readable_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "enqueue", "--unique-for",
                           "60", "t.add"], cwd=ROOT, capture_output=True, text=True,
                          env=worker_env(f"sqlite:///{tmp_path}/b.db"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "conveyor: --unique-for needs --unique-key: the key to hold for that long"]
