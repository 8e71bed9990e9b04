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


def test_enqueue_wait_prints_the_outcome(tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    env = worker_env(url)
    waiting = conveyor("enqueue", "t.add", "-Q", unique, "--args", "[20, 22]", "--wait",
                       "--timeout", "60", env=env)
    worker = start_worker(url, unique)
    out, err = waiting.communicate(timeout=60)
    finish(worker)
    assert waiting.returncode == 0, err
    sent, final = (json.loads(line) for line in out.splitlines())
    assert final["kind"] == "succeeded" and final["result"] == 42
    assert final["message_id"] == sent["id"]


def test_enqueue_wait_fails_for_a_dead_letter(tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    env = worker_env(url)
    waiting = conveyor("enqueue", "t.unregistered", "-Q", unique, "--wait", env=env)
    worker = start_worker(url, unique)
    out, _ = waiting.communicate(timeout=60)
    finish(worker)
    assert waiting.returncode == 1
    assert "unknown task" in json.loads(out.splitlines()[-1])["reason"]


def test_bad_json_args_are_one_readable_line(tmp_path: Path) -> None:
    env = worker_env(f"sqlite:///{tmp_path}/b.db")
    proc = conveyor("enqueue", "t.add", "--args", "{oops", env=env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "--args: not JSON" in err
