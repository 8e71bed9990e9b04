"""The command line's rough edges a newcomer hit (issue 26), each as a user runs it: real
processes, the embedded SQLite broker and state store in the test's own CONVEYOR_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.scheduler import examples
from tests.support import spawn, stop

EXAMPLE_DAGS = Path(examples.__file__).parent / "dags"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A reader's shell: no CONVEYOR_* of ours, the data directory in the test's temp dir."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return {**clean, "CONVEYOR_HOME": str(tmp_path / "home")}


def conveyor_in(env: dict[str, str], *args: str, check: bool = True,
                cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`conveyor ARGS` with exactly `env` (none of the test process's CONVEYOR_*)."""
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=cwd)
    if check and done.returncode != 0:
        raise AssertionError(f"conveyor {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def revenue_run(env: dict[str, str]) -> str:
    """The example revenue DAG triggered by hand and run to its end by a scheduler and a
    worker, as the issue did it: no ledger (only `conveyor up` sets one up)."""
    worker = spawn("worker", "--concurrency", "2", "--app",
                   "conveyor.scheduler.examples.revenue", "--log-level", "WARNING", env=env)
    try:
        run_id = json.loads(conveyor_in(env, "dags", "trigger", "revenue", "--dags-folder",
                                        str(EXAMPLE_DAGS), "--json").stdout)["run_id"]
        conveyor_in(env, "scheduler", "--burst", "--dags-folder", str(EXAMPLE_DAGS),
                    "--log-level", "WARNING")
    finally:
        stop(worker)
    return str(run_id)


def test_the_example_revenue_dag_triggered_by_hand_fails_once_then_succeeds(
        env: dict[str, str]) -> None:
    run_id = revenue_run(env)
    shown = json.loads(conveyor_in(env, "runs", "show", run_id, "--json").stdout)
    states = {t["task_id"]: (t["state"], t["attempt"]) for t in shown["tasks"]}
    assert shown["run"]["state"] == "success", states
    assert states["extract_payments"] == ("success", 2)   # fails once, succeeds on its retry


def closed_pipe(env: dict[str, str], *args: str) -> tuple[int, str]:
    """`conveyor ARGS | head -0`: the reader is gone before the first line is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    finally:
        os.close(write)
    return done.returncode, done.stderr


def test_a_reader_that_stops_early_ends_every_command_quietly(env: dict[str, str]) -> None:
    run_id = revenue_run(env)
    for args in (["status"], ["config", "show"], ["runs", "show", run_id],
                 ["tasks", "show", run_id, "extract_payments"], ["runs", "list"]):
        code, stderr = closed_pipe(env, *args)
        assert (code, stderr) == (141, ""), f"conveyor {' '.join(args)}: {stderr}"
    done = subprocess.run(f"{sys.executable} -m conveyor.cli status | head -1", shell=True,
                          capture_output=True, text=True, env=env, timeout=60)
    assert (done.stdout, done.stderr) == ("queues\n", "")


def test_after_a_run_a_wrong_id_says_which_and_mark_and_clear_read_true(
        env: dict[str, str]) -> None:
    run_id = revenue_run(env)
    missing = conveyor_in(env, "tasks", "show", "NOPE", "extract_orders", check=False)
    assert missing.returncode == 2
    assert "no run 'NOPE' in the state store" in missing.stderr, missing.stderr

    def row(task: str) -> list[str]:
        table = conveyor_in(env, "runs", "show", run_id).stdout
        return next(line for line in table.splitlines() if line.startswith(task)).split()

    took = row("extract_orders")[6]          # TASK STATE ATTEMPT EXECUTOR QUEUE STARTED TOOK
    conveyor_in(env, "tasks", "mark", run_id, "extract_orders", "failed")
    assert row("extract_orders")[1:3] == ["failed", "1/4"]
    assert row("extract_orders")[6] == took           # what it took, not the time to the mark
    conveyor_in(env, "tasks", "clear", run_id, "extract_orders", "--only")
    assert row("extract_orders")[1:3] == ["pending", "0/4"]   # a fresh budget, untried
    revenue_worker_and_scheduler(env)
    assert row("extract_orders")[1:3] == ["success", "1/4"]   # not 2/5
    shown = conveyor_in(env, "tasks", "show", run_id, "extract_orders").stdout
    assert "attempt 1 of 4 since it was cleared (attempt 2 in all)" in shown


def revenue_worker_and_scheduler(env: dict[str, str]) -> None:
    """A worker and a burst scheduler over the example DAGs, until no run is left to run."""
    worker = spawn("worker", "--concurrency", "2", "--app",
                   "conveyor.scheduler.examples.revenue", "--log-level", "WARNING", env=env)
    try:
        conveyor_in(env, "scheduler", "--burst", "--dags-folder", str(EXAMPLE_DAGS),
                    "--log-level", "WARNING")
    finally:
        stop(worker)


def test_a_wrong_dead_letter_id_is_an_error_and_nothing_is_requeued(
        env: dict[str, str]) -> None:
    conveyor_in(env, "enqueue", "no.such.task")
    conveyor_in(env, "worker", "--burst", "--concurrency", "1", "--log-level", "ERROR")
    dead = json.loads(conveyor_in(env, "dead-letters", "list", "--json").stdout)
    [letter] = dead["dead_letters"]
    wrong = conveyor_in(env, "dead-letters", "requeue", "--id", letter["id"], "--id", "99999",
                        check=False)
    assert wrong.returncode == 2, wrong
    assert "no dead letter '99999' in queues default" in wrong.stderr
    assert "nothing was requeued" in wrong.stderr
    after = json.loads(conveyor_in(env, "dead-letters", "list", "--json").stdout)
    assert [d["id"] for d in after["dead_letters"]] == [letter["id"]]


def test_reading_creates_no_state_and_says_there_is_nothing_yet(
        env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in env.items() if k not in ("CONVEYOR_HOME", "XDG_DATA_HOME")}
    env["HOME"] = str(tmp_path / "user")      # the default data directory is under it
    data = tmp_path / "user" / ".local" / "share" / "conveyor"
    listed = conveyor_in(env, "runs", "list")
    assert listed.stdout.startswith(f"no runs yet: {data / 'scheduler.db'} does not exist")
    assert json.loads(conveyor_in(env, "runs", "list", "--json").stdout) == {"runs": []}
    assert conveyor_in(env, "status").stdout.startswith("nothing has run yet: ")
    assert json.loads(conveyor_in(env, "dead-letters", "list", "--json").stdout)[
        "dead_letters"] == []
    for args in (["runs", "show", "R"], ["tasks", "show", "R", "t"]):
        shown = conveyor_in(env, *args, check=False)
        assert shown.returncode == 2 and "no run 'R' in the state store: " in shown.stderr
    dags = conveyor_in(env, "dags", "list", "--dags-folder", str(EXAMPLE_DAGS)).stdout
    assert dags.splitlines()[1].split()[:2] == ["revenue", "6"]
    assert conveyor_in(env, "limits", "list").stdout.startswith("no limits yet")
    letter = conveyor_in(env, "dead-letters", "show", "1", check=False)
    assert letter.returncode == 2 and "no dead letter or message '1': the broker " in \
        letter.stderr
    assert not (tmp_path / "user").exists(), list((tmp_path / "user").rglob("*"))


DAILY = "from conveyor import DAG\n\ndag = DAG('daily', schedule='0 3 * * *')\n" \
        "dag.command('sync', ['true'])\n"


def test_a_week_backfilled_is_seven_runs_listed_newest_logical_date_first(
        env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "daily.py").write_text(DAILY)
    week = ["dags", "backfill", "daily", "--from", "2026-11-01", "--to", "2026-11-07"]
    created = json.loads(conveyor_in(env, *week, "--json", cwd=tmp_path).stdout)
    assert len(created["created"]) == 7, created
    again = conveyor_in(env, *week, cwd=tmp_path).stdout
    assert again.strip() == "0 run(s) of daily created, 7 already there"
    runs = json.loads(conveyor_in(env, "runs", "list", "--json").stdout)["runs"]
    days = [conveyor_date(r["logical_date"]) for r in runs]
    assert days == [f"2026-11-0{d}T03:00:00" for d in range(7, 0, -1)]


def conveyor_date(stamp: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%S")


FLOW = """from conveyor import DAG, task


@task(name="flow.hello")
def hello() -> str:
    return "hello from a DAG file"


dag = DAG("flow")
dag.task(hello)
"""


def test_a_worker_runs_the_tasks_its_dag_files_define_and_says_what_to_add_otherwise(
        env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "flow.py").write_text(FLOW)
    (tmp_path / "dags" / "broken.py").write_text("import no_such_module\n")
    conveyor_in(env, "enqueue", "flow.hello", cwd=tmp_path)
    ran = conveyor_in(env, "worker", "--burst", "-c", "1", cwd=tmp_path)   # ./dags: default
    assert "DAG file" in ran.stderr and "broken.py not imported" in ran.stderr, ran.stderr
    assert json.loads(conveyor_in(env, "dead-letters", "list", "--json").stdout)[
        "dead_letters"] == []

    conveyor_in(env, "enqueue", "flow.hello", cwd=tmp_path)
    conveyor_in(env, "worker", "--burst", "-c", "1", "--dags-folder", "", cwd=tmp_path)
    [dead] = json.loads(conveyor_in(env, "dead-letters", "list", "--json").stdout)[
        "dead_letters"]
    assert dead["reason"].startswith("unknown task 'flow.hello': no module given with --app, "
                                     "nor a DAG file of --dags-folder, registers it: add the "
                                     "module that defines it to --app, or give the worker the "
                                     "DAGs folder whose file defines it"), dead

    wrong = conveyor_in(env, "worker", "--burst", "--dags-folder", "nowhere", cwd=tmp_path,
                        check=False)
    assert wrong.returncode == 2
    assert "--dags-folder 'nowhere' is not a folder" in wrong.stderr


BILLING = """from conveyor import task

ORDERS = {"2026-11-23": [120.0, -15.5, 80.25]}


@task(queue="heavy")
def clean_orders(day: str) -> float:
    return sum(amount for amount in ORDERS.get(day, []) if amount > 0)
"""


def test_enqueue_uses_the_tasks_own_queue_prints_the_value_alone_and_says_when_untaken(
        env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "billing").mkdir()
    (tmp_path / "billing" / "tasks.py").write_text(BILLING)
    enqueue = ["enqueue", "billing.tasks.clean_orders", "--args", '["2026-11-23"]', "--wait"]
    untaken = conveyor_in(env, *enqueue, "--timeout", "12", cwd=tmp_path, check=False)
    assert untaken.returncode == 1 and untaken.stdout == ""
    said = untaken.stderr.splitlines()
    assert said[0].startswith("conveyor: enqueued ") and said[0].endswith(
        "on queue 'heavy' (the task's own, from billing.tasks)"), said
    assert said[1] == ("conveyor: still waiting: it is still queued on 'heavy' and nothing "
                       "has taken it: is a worker consuming that queue? (`conveyor worker "
                       "-Q heavy`)"), said
    assert said[2].startswith("conveyor: no result for ") and "within 12 s" in said[2]

    worker = spawn("worker", "-Q", "heavy", "--app", "billing.tasks", "-c", "1",
                   env={**env, "PYTHONPATH": str(tmp_path)})
    try:
        value = conveyor_in(env, *enqueue, cwd=tmp_path)
    finally:
        stop(worker)
    assert value.stdout == "200.25\n", value     # $(conveyor enqueue … --wait) is the value


FLAKY = """from conveyor import task


@task(name="flaky.boom", max_retries=1, retry_backoff=0.0)
def boom(path: str) -> None:
    with open(path, "a") as runs:
        runs.write("ran\\n")
    raise RuntimeError("boom")
"""


def test_a_requeued_dead_letter_gets_one_more_try_and_with_fresh_a_fresh_budget(
        env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "flaky.py").write_text(FLAKY)
    ran = tmp_path / "ran.txt"
    burst = ["worker", "--app", "flaky", "--burst", "-c", "1", "--log-level", "ERROR"]

    def runs_after(*requeue: str) -> tuple[int, str]:
        said = conveyor_in(env, "dead-letters", "requeue", "--all", *requeue).stdout \
            if requeue != ("first",) else ""
        conveyor_in(env, *burst, cwd=tmp_path)
        return len(ran.read_text().splitlines()), said

    conveyor_in(env, "enqueue", "flaky.boom", "--args", json.dumps([str(ran)]), cwd=tmp_path)
    assert runs_after("first")[0] == 2                  # attempts 1 and 2: budget spent
    count, said = runs_after()
    assert count == 3 and said.startswith("requeued 1 dead letter(s) each keeping its attempt "
                                          "count: one more try each"), said
    count, said = runs_after("--fresh")
    assert count == 5 and said.startswith("requeued 1 dead letter(s) with a fresh retry "
                                          "budget (attempt 1)"), said
    [dead] = json.loads(conveyor_in(env, "dead-letters", "list", "--json").stdout)[
        "dead_letters"]
    assert "(attempt 2 of 2, budget spent)" in dead["reason"], dead


def test_the_default_dags_folder_is_dags_here_else_the_one_up_runs(
        env: dict[str, str], tmp_path: Path) -> None:
    """What `conveyor up` writes at start (fabricated here; the README test runs a real
    `up`): commands typed where there is no ./dags use its folder, and say which."""
    home = Path(env["CONVEYOR_HOME"])
    home.mkdir(parents=True)
    (home / "up-dags-folder").write_text(f"{EXAMPLE_DAGS}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = conveyor_in(env, "dags", "list", cwd=elsewhere).stdout
    assert listed.splitlines()[1].split()[0] == "revenue"
    ran = conveyor_in(env, "scheduler", "--burst", cwd=elsewhere)
    assert f"(revenue) from {EXAMPLE_DAGS.resolve()}," in ran.stderr, ran.stderr

    (elsewhere / "dags").mkdir()
    (elsewhere / "dags" / "daily.py").write_text(DAILY)
    listed = conveyor_in(env, "dags", "list", cwd=elsewhere).stdout
    assert [line.split()[0] for line in listed.splitlines()[1:]] == ["daily"]


def test_the_local_executors_worker_runs_the_tasks_a_dag_file_defines(
        env: dict[str, str], tmp_path: Path) -> None:
    flows = tmp_path / "flows"          # not ./dags: only --dags-folder names it
    flows.mkdir()
    (flows / "flow.py").write_text(FLOW.replace("dag.task(hello)",
                                                "dag.task(hello, executor='local')"))
    flags = ["--dags-folder", str(flows), "--executors", "queue,local"]
    scheduler = spawn("scheduler", *flags, "--log-level", "WARNING", env=env)
    try:
        done = conveyor_in(env, "dags", "trigger", "flow", *flags, "--wait", "--timeout", "90",
                           "--json", cwd=tmp_path)
    finally:
        stop(scheduler)
    [hello] = json.loads(done.stdout)["tasks"]
    assert (hello["state"], hello["result"]) == ("success", "hello from a DAG file"), hello


def test_status_says_whether_a_scheduler_runs(env: dict[str, str]) -> None:
    """Runs that never move, an events queue that only grows: no scheduler holds a lease,
    and status says so (and what to start) beside the queues and workers."""
    from conveyor.scheduler.lease import SchedulerLease
    from conveyor.state import store as stores
    assert "\nschedulers: none running: runs stay as they are and what workers report " \
        "waits on conveyor.scheduler.events until one runs (`conveyor scheduler`)\n" in \
        conveyor_in(env, "status").stdout
    url = f"sqlite:///{env['CONVEYOR_HOME']}/scheduler.db"
    Path(env["CONVEYOR_HOME"]).mkdir(parents=True)
    stores.from_url(url).close()
    lease = SchedulerLease(url, "s1", 30.0)
    lease.renew()
    try:
        assert f"\nschedulers: {lease.row['hostname']} pid {os.getpid()}\n" in \
            conveyor_in(env, "status").stdout
        doc = json.loads(conveyor_in(env, "status", "--json").stdout)
        assert doc["schedulers"] == [{"scheduler": "s1", "host": lease.row["hostname"],
                                      "pid": os.getpid()}]
    finally:
        lease.close()
