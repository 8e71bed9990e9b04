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


def enqueue_and_drain(url: str, queue: str, *argv: str) -> tuple[int, list[str]]:
    """Run `conveyor enqueue … --wait`, then a burst worker once the message is published
    (a burst worker started first could find the queue empty and leave at once)."""
    waiting = conveyor("enqueue", *argv, "-Q", queue, "--wait", "--timeout", "60",
                       env=worker_env(url))
    try:
        assert waiting.stdout is not None
        sent = waiting.stdout.readline()
        finish(start_worker(url, queue))
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
        waiting.communicate()
    return waiting.returncode, [sent, *out.splitlines(), *err.splitlines()] if sent else [err]


def test_enqueue_wait_prints_the_return_value(tmp_path: Path, unique: str) -> None:
    code, lines = enqueue_and_drain(f"sqlite:///{tmp_path}/b.db", unique, "t.add",
                                    "--args", "[20, 22]")
    assert code == 0, lines
    sent, value = (json.loads(line) for line in lines)
    assert value == 42 and sent["task"] == "t.add"


def test_enqueue_wait_fails_for_a_dead_letter(tmp_path: Path, unique: str) -> None:
    code, lines = enqueue_and_drain(f"sqlite:///{tmp_path}/b.db", unique, "t.unregistered")
    assert code == 1, lines
    assert "dead-lettered: unknown task" in lines[-1]


def test_bad_json_args_are_one_readable_line(tmp_path: Path) -> None:
    env = worker_env(f"sqlite:///{tmp_path}/b.db")
    proc = conveyor("enqueue", "t.add", "--args", "{oops", env=env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "--args: not JSON" in err
