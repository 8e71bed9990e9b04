"""`conveyor up` as a newcomer runs it: one command, the revenue DAG to success, status
showing it, Ctrl-C draining everything, and a restart that resumes instead of re-running."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conveyor.scheduler.examples.revenue import ledger_counts
from tests.support import free_port


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return {**clean, "CONVEYOR_HOME": str(tmp_path / "home")}


def start_up(env: dict[str, str], processes: list[subprocess.Popen[str]],
             ui_port: int = 0) -> subprocess.Popen[str]:
    """`conveyor up` in the test's directory; its logs go to up.log there."""
    folder = Path(env["CONVEYOR_HOME"]).parent
    with open(folder / "up.log", "a") as logs:
        proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "up", "--metrics-port=0",
                                 "--drain-timeout=5", f"--ui-port={ui_port}"], env=env,
                                text=True, cwd=folder,
                                stdout=subprocess.PIPE, stderr=logs)
    processes.append(proc)
    return proc


def close(proc: subprocess.Popen[str]) -> None:
    if proc.stdout is not None:
        proc.stdout.close()


_PENDING: dict[int, str] = {}


def read_until(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> list[str]:
    """stdout lines up to and including the first containing `text` (read from the pipe's
    descriptor: a buffered reader could hold lines that select() no longer reports)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = _PENDING.get(proc.pid, "")
        while "\n" in pending:
            line, pending = pending.split("\n", 1)
            _PENDING[proc.pid] = pending
            lines.append(line + "\n")
            if text in line:
                return lines
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                break
            _PENDING[proc.pid] = pending + chunk
    raise AssertionError(f"no line with {text!r} within {timeout:g} s:\n{''.join(lines)}")


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def conveyor_json(env: dict[str, str], *argv: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", *argv, "--json"], env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def interrupt(proc: subprocess.Popen[str]) -> list[int]:
    """SIGINT, as Ctrl-C does; wait for the exit; the processes that were below it."""
    below = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    close(proc)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in below if alive(p)]


def test_up_runs_revenue_to_success_drains_on_ctrl_c_and_resumes(
        env: dict[str, str], processes: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    first = start_up(env, processes, ui_port=port)
    lines = read_until(first, "of revenue: success")
    assert any("broker       sqlite:///" in line for line in lines)
    run_id = lines[-1].split()[1]
    assert f"  dashboard    http://127.0.0.1:{port}/ (read-only" in "".join(lines)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs/{run_id}") as shown:
        assert json.loads(shown.read())["run"]["state"] == "success"
    status = conveyor_json(env, "status")
    [run] = [r for r in status["runs"] if r["run_id"] == run_id]  # type: ignore[attr-defined]
    assert run["state"] == "success" and len(run["tasks"]) == 6
    assert run["tasks"]["extract_payments"] == {"state": "success", "attempt": 2}
    shown_values(env, run_id)
    assert interrupt(first) == []

    second = start_up(env, processes)
    read_until(second, f"run {run_id} of revenue: today's run exists (success), resuming it")
    assert interrupt(second) == []
    runs = conveyor_json(env, "runs", "list")["runs"]
    assert [r["run_id"] for r in runs] == [run_id]  # type: ignore[attr-defined]
    ledger = ledger_counts(str(Path(env["CONVEYOR_HOME"]) / "revenue-ledger.txt"))
    assert ledger["extract_orders"] == 1 and ledger["load_dashboard"] == 1


def shown_values(env: dict[str, str], run_id: str) -> None:
    """The revenue tasks passed real data down, and the operator commands show it."""
    home = Path(env["CONVEYOR_HOME"])
    shown = subprocess.run([sys.executable, "-m", "conveyor.cli", "tasks", "show", run_id,
                            "extract_orders"], env=env, text=True, capture_output=True,
                           timeout=60, check=True).stdout
    assert f'result: {{"rows": 1200, "path": "{home}/orders.csv"}}' in shown, shown
    done = conveyor_json(env, "tasks", "show", run_id, "aggregate_revenue")
    assert done["task"]["result"] == {"revenue": 51594.0, "orders": 1200,  # type: ignore[index]
                                      "payments": 1150}
    load = conveyor_json(env, "tasks", "show", run_id, "load_dashboard")
    assert load["task"]["result"] == (  # type: ignore[index]
        "dashboard updated: revenue 51594.00 from 1200 orders")
    table = subprocess.run([sys.executable, "-m", "conveyor.cli", "runs", "show", run_id],
                           env=env, text=True, capture_output=True, timeout=60,
                           check=True).stdout
    assert '{"rows": 1200, "path": ' in table and "…" in table, table


def argvs() -> list[tuple[int, str]]:
    """(parent pid, command line) of every process, as any process of the host reads them."""
    found = []
    for path in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((path / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (path / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError, IndexError):
            continue   # gone meanwhile
        found.append((ppid, cmdline.decode(errors="replace")))
    return found


def test_up_runs_the_same_system_on_redis_and_postgres(
        env: dict[str, str], processes: list[subprocess.Popen[str]], unique: str) -> None:
    from tests.conftest import POSTGRES_URL, REDIS_URL, clean_transport, require_service
    require_service("redis")
    require_service("postgres")
    # a password (trust auth ignores it) that no process may show in its argv
    state_url = POSTGRES_URL.replace("postgres@", "postgres:pw@", 1) + f"?schema={unique}"
    env = {**env, "CONVEYOR_BROKER_URL": f"{REDIS_URL}?prefix={unique}",
           "CONVEYOR_STATE_URL": state_url}
    try:
        proc = start_up(env, processes)
        lines = read_until(proc, "of revenue: success")
        assert any(f"broker       {REDIS_URL}?prefix={unique}" in line for line in lines)
        see = next(line for line in lines if line.startswith("  see "))  # a new shell's URLs
        masked = state_url.replace("postgres:pw@", "postgres:***@", 1)
        assert (f"export CONVEYOR_BROKER_URL='{REDIS_URL}?prefix={unique}' "
                f"CONVEYOR_STATE_URL='{masked}')") in see, see
        children = [cmdline for ppid, cmdline in argvs() if ppid == proc.pid]
        assert any(" scheduler " in cmdline for cmdline in children), children
        assert not [cmdline for _, cmdline in argvs() if unique in cmdline]   # nor pw
        shown_values(env, lines[-1].split()[1])
        proc.send_signal(signal.SIGINT)     # one Ctrl-C: the scheduler stops by itself,
        stopped = read_until(proc, "conveyor up: stopped")[-1]   # not by a second SIGTERM
        assert "(scheduler exit 0)" in stopped, stopped
        assert proc.wait(timeout=60) == 0
        runs = conveyor_json(env, "runs", "list")["runs"]
        assert [r["state"] for r in runs] == ["success"]  # type: ignore[attr-defined]
    finally:
        clean_transport("redis", unique)
        clean_transport("postgres", unique)


def test_a_second_ctrl_c_is_a_cold_stop(env: dict[str, str],
                                        processes: list[subprocess.Popen[str]]) -> None:
    proc = start_up({**env, "CONVEYOR_REVENUE_PAUSE": "60"}, processes)   # clean_orders: 60 s
    run_id = read_until(proc, "of revenue: created")[-1].split()[1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        [run] = [r for r in conveyor_json(env, "status")["runs"]  # type: ignore[attr-defined]
                 if r["run_id"] == run_id]
        if run["tasks"]["clean_orders"]["state"] == "running":
            break
        time.sleep(0.2)
    below = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    read_until(proc, "draining")
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 10     # not the 60 s task, nor the 5 s drain timeout
    close(proc)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in below if alive(p)] == []


PIPE = '''
from conveyor.scheduler import DAG
from mods_a import first
{more_import}

dag = DAG("pipe")
a = dag.task(first)
{more}
'''


def test_up_follows_a_dag_file_that_brings_a_new_task_module(
        tmp_path: Path, env: dict[str, str], processes: list[subprocess.Popen[str]]) -> None:
    """The workers `up` started import the task modules the DAGs needed then; a new module
    (mods_b) reaches them without a restart: they drain, new ones import it, and only then
    does the scheduler run the new version."""
    for name, fn, value in (("mods_a", "first", 1), ("mods_b", "second", 2)):
        (tmp_path / f"{name}.py").write_text(
            f"from conveyor import task\n\n\n@task\ndef {fn}(*_: object) -> int:\n"
            f"    return {value}\n")
    dags = tmp_path / "dags"
    dags.mkdir()
    pipe = dags / "pipe.py"
    pipe.write_text(PIPE.format(more_import="", more=""))
    env.update(CONVEYOR_DAGS_FOLDER=str(dags), CONVEYOR_DAGS_RELOAD_INTERVAL="0.3")
    up = start_up(env, processes)
    read_until(up, "stop         Ctrl-C")

    def run_pipe() -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", "dags", "trigger", "pipe",
                               "--wait", "--timeout=90", "--json"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    assert [t["task_id"] for t in run_pipe()["tasks"]] == ["first"]
    pipe.write_text(PIPE.format(more_import="from mods_b import second",
                                more="a >> dag.task(second)"))
    log = tmp_path / "up.log"
    deadline = time.monotonic() + 30
    while "DAG pipe (pipe.py): version" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    assert "task modules are now mods_a,mods_b" in log.read_text()
    second = run_pipe()
    assert second["run"]["state"] == "success", second
    assert {t["task_id"]: t["state"] for t in second["tasks"]} == {
        "first": "success", "second": "success"}
    assert interrupt(up) == []


FLOW = '''
from conveyor import DAG, task


@task(name="flow.answer")
def answer() -> int:
    return {value}


dag = DAG("flow")
dag.task(answer)
'''


def test_up_runs_a_task_its_dag_file_defines_and_follows_the_file(
        tmp_path: Path, env: dict[str, str], processes: list[subprocess.Popen[str]]) -> None:
    """No --app module registers flow.answer: up's workers import the DAG files, and are
    replaced when the file changes, so the next run has the task's new code."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "flow.py").write_text(FLOW.format(value=1))
    env.update(CONVEYOR_DAGS_FOLDER=str(dags), CONVEYOR_DAGS_RELOAD_INTERVAL="0.3")
    up = start_up(env, processes)
    read_until(up, "stop         Ctrl-C")

    def answer() -> Any:
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", "dags", "trigger", "flow",
                               "--wait", "--timeout=90", "--json"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)["tasks"][0]["result"]

    assert answer() == 1
    (dags / "flow.py").write_text(FLOW.format(value=2))
    log = tmp_path / "up.log"
    deadline = time.monotonic() + 30
    while "(and the DAG files defining flow.answer@" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    # a run triggered while the old workers get their drain signal may still be theirs
    answers = [answer()]
    while answers[-1] != 2 and time.monotonic() < deadline + 30:
        answers.append(answer())
    assert answers[-1] == 2 and set(answers) <= {1, 2}, answers
    assert interrupt(up) == []
