"""The scheduler's command line as a user runs it: `dags list`, `dags trigger`, `scheduler`,
`runs show`, `submit`, each readable for people and with --json for scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.scheduler import examples
from tests.support import conveyor, spawn, stop

DAGS = Path(examples.__file__).parent / "dags"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
            "CONVEYOR_STATE_URL": f"sqlite:///{tmp_path}/state.db",
            "CONVEYOR_REVENUE_LEDGER": str(tmp_path / "ledger"),
            "CONVEYOR_REVENUE_SEED": "0"}


def test_dags_list_shows_good_dags_and_each_error_with_file_and_line(
        tmp_path: Path, env: dict[str, str]) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "revenue_dag.py").write_text((DAGS / "revenue_dag.py").read_text())
    (folder / "broken.py").write_text("from conveyor.scheduler import DAG\n\ndag = DAG('b')\n"
                                      "dag.command('a', ['true'], upstream=['nope'])\n")
    env["CONVEYOR_DAGS_FOLDER"] = str(folder)

    listed = conveyor("dags", "list", "--json", env=env, check=False)
    assert listed.returncode == 1
    doc = json.loads(listed.stdout)
    assert [d["dag_id"] for d in doc["dags"]] == ["revenue"]
    assert doc["dags"][0]["tasks"] == 6 and len(doc["dags"][0]["version"]) == 12
    assert doc["errors"][0]["file"].endswith("broken.py") and doc["errors"][0]["line"] == 4
    assert "depends on 'nope'" in doc["errors"][0]["error"]

    people = conveyor("dags", "list", env=env, check=False)
    assert people.stdout.splitlines()[0].split()[:3] == ["DAG_ID", "SCHEDULE", "TASKS"]
    assert f"error: {folder / 'broken.py'}:4: task 'a' of DAG 'b'" in people.stderr


def test_trigger_then_a_burst_scheduler_runs_it_and_runs_show_tells_the_story(
        tmp_path: Path, env: dict[str, str]) -> None:
    folder = tmp_path / "dags"      # the revenue DAG beside a file that cannot load
    folder.mkdir()
    (folder / "revenue_dag.py").write_text((DAGS / "revenue_dag.py").read_text())
    (folder / "broken.py").write_text("import no_such_module\n")
    env["CONVEYOR_DAGS_FOLDER"] = str(folder)
    worker = spawn("worker", "--queues", "default", "--concurrency", "2", "--app",
                   "conveyor.scheduler.examples.revenue", "--log-level", "WARNING", env=env)
    try:
        queued = json.loads(conveyor("dags", "trigger", "revenue", "--conf", '{"day": "x"}',
                                     "--json", env=env).stdout)
        assert queued["state"] == "queued"
        scheduled = conveyor("scheduler", "--burst", "--log-level", "WARNING", env=env)
        assert f"DAG not loaded: {folder / 'broken.py'}:1: ModuleNotFoundError" in \
            scheduled.stderr
    finally:
        stop(worker)
    shown = json.loads(conveyor("runs", "show", queued["run_id"], "--json", env=env).stdout)
    assert shown["run"]["state"] == "success" and shown["run"]["conf"] == '{"day": "x"}'
    states = {t["task_id"]: (t["state"], t["attempt"]) for t in shown["tasks"]}
    assert states["extract_payments"] == ("success", 2)   # seed 0: fails once
    assert len(shown["attempts"]) == 7

    table = conveyor("runs", "show", queued["run_id"], env=env).stdout
    assert f"run {queued['run_id']} of revenue" in table and "success" in table
    row = next(line for line in table.splitlines() if line.startswith("extract_payments"))
    assert row.split()[:5] == ["extract_payments", "success", "2/3", "queue", "default"]
    assert "failed attempts:" in table and "extract_payments #1" in table


def test_submit_a_failing_command_retries_then_fails_with_its_error(env: dict[str, str]) -> None:
    env["CONVEYOR_DAGS_FOLDER"] = str(DAGS)
    worker = spawn("worker", "--queues", "default", "--concurrency", "1", "--log-level",
                   "WARNING", env=env)
    scheduler = spawn("scheduler", "--log-level", "WARNING", env=env)
    try:
        done = conveyor("submit", "flaky", "--retries", "1", "--retry-delay", "0.05", "--wait",
                        "--timeout", "120", "--json", "--command", "sh", "-c",
                        "echo out of cheese >&2; exit 3", env=env, check=False)
    finally:
        stop(scheduler)
        stop(worker)
    assert done.returncode == 1, done.stderr
    shown = json.loads(done.stdout)
    assert shown["run"]["dag_id"] == "_submit" and shown["run"]["state"] == "failed"
    assert [(t["task_id"], t["state"], t["attempt"]) for t in shown["tasks"]] == \
        [("flaky", "failed", 2)]
    assert [a["outcome"] for a in shown["attempts"]] == ["failed", "failed"]


def test_bad_configuration_stops_with_one_readable_line(env: dict[str, str]) -> None:
    done = conveyor("scheduler", "--executors", "queue,celery", env=env, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "conveyor: executors 'queue,celery': each must be one of queue, local, kubernetes "
        "(the first is the default)"]
    missing = conveyor("dags", "trigger", "nope", "--dags-folder", str(DAGS), env=env,
                       check=False)
    assert missing.returncode == 2 and "no DAG 'nope'" in missing.stderr
    unknown = conveyor("runs", "show", "NOPE", env=env, check=False)
    assert unknown.returncode == 2 and "no run 'NOPE' in the state store" in unknown.stderr


def test_a_dag_file_that_blocks_at_import_is_stopped_and_the_others_load(
        tmp_path: Path, env: dict[str, str]) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "revenue_dag.py").write_text((DAGS / "revenue_dag.py").read_text())
    (folder / "slow.py").write_text("import time\n\ntime.sleep(120)\n")
    (folder / "spin.py").write_text("while True:\n    try:\n        pass\n"
                                    "    except Exception:\n        pass\n")
    env.update(CONVEYOR_DAGS_FOLDER="dags", CONVEYOR_DAG_IMPORT_TIMEOUT="1")

    listed = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "dags", "list", "--json"], cwd=tmp_path,
        capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert listed.returncode == 1
    doc = json.loads(listed.stdout)
    assert [d["dag_id"] for d in doc["dags"]] == ["revenue"]
    assert doc["dags"][0]["file"] == str(folder / "revenue_dag.py")   # absolute paths
    errors = {Path(e["file"]).name: e for e in doc["errors"]}
    assert errors["slow.py"]["file"] == str(folder / "slow.py") and errors["slow.py"]["line"] == 3
    assert "took longer than 1 s" in errors["slow.py"]["error"]
    assert errors["spin.py"]["line"] in (1, 2, 3, 4, 5)
    assert "Traceback" not in listed.stderr
