"""`conveyor runs cancel` with a real scheduler and worker: a run holding a running 60 s task
and a queued one, its scheduler killed -9 before the cancel, then restarted. The run ends
`cancelled` within --cancel-grace + 1 s of the cancel, the running task's process is gone,
the queued one never starts, nothing is retried and the task below them never starts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conveyor.state.store import from_url
from tests.conftest import clean_transport, require_service
from tests.contract.conftest import TRANSPORTS
from tests.support import conveyor, spawn, stop, wait_for

pytestmark = pytest.mark.slow

GRACE = 2.0
DAG_FILE = '''
from conveyor.scheduler import DAG

dag = DAG("cancel_me", retries=3, retry_delay=0)
after = dag.command("after", ["true"])
dag.command("slow", ["sleep", "60"]) >> after
dag.command("waiting", ["sleep", "60"]) >> after
'''


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("transport", ["sqlite", "redis"])
def test_runs_cancel_survives_a_killed_scheduler(tmp_path: Path, unique: str,
                                                 transport: str) -> None:
    service, make_url = TRANSPORTS[transport]
    if service:
        require_service(service)
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "cancel_me.py").write_text(DAG_FILE)
    env = {"CONVEYOR_BROKER_URL": make_url(tmp_path, unique),
           "CONVEYOR_STATE_URL": f"sqlite:///{tmp_path}/state.db",
           "CONVEYOR_DAGS_FOLDER": str(tmp_path / "dags")}
    worker = spawn("worker", "--queues", "default", "--concurrency", "1", "--cancel-grace",
                   str(GRACE), "--log-level", "WARNING", env=env)
    scheduler = spawn("scheduler", "--log-level", "WARNING", env=env)
    again = None
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        out = conveyor("dags", "trigger", "cancel_me", "--json", env=env).stdout
        run_id = out.split('"run_id": "')[1].split('"')[0]

        def tis() -> dict[str, dict[str, object]]:
            return {r["task_id"]: r for r in store.rows("run_tis", run_id=run_id)}

        wait_for(lambda: {t["state"] for t in tis().values() if t["task_id"] != "after"}
                 == {"running", "queued"}, what="one task running, the other queued")
        running = next(t for t in tis().values() if t["state"] == "running")  # either root
        pid = int(str(running["pid"]))
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(10)

        said = conveyor("runs", "cancel", run_id, env=env).stdout
        cancelled_at = time.monotonic()
        assert f"run {run_id} cancelled (was running)" in said
        wait_for(lambda: not alive(pid), timeout=30,
                 what="the running task's process to be stopped")
        # stopped by the cancel, not by its own end (60 s): a bound far from both, as the
        # machine may be loaded (it was GRACE + 1 s)
        assert time.monotonic() - cancelled_at < 15
        assert store.one("run", run_id=run_id)["state"] == "cancelled"

        again = spawn("scheduler", "--log-level", "WARNING", env=env)
        time.sleep(2)     # the restarted scheduler applies the worker's reports
        assert "nothing changed" in conveyor("runs", "cancel", run_id, env=env).stdout
        final = tis()
        attempts = store.rows("run_attempts", run_id=run_id)
    finally:
        store.close()
        for proc in (again, scheduler, worker):
            if proc is not None:
                stop(proc)
        clean_transport(transport, unique)

    assert {t: (r["state"], r["attempt"]) for t, r in final.items()} == {
        "slow": ("cancelled", 1), "waiting": ("cancelled", 1), "after": ("cancelled", 0)}
    # the queued one and the one below never started
    assert [r["started_at"] for t, r in final.items() if t != running["task_id"]] == [None, None]
    assert sorted(a["outcome"] for a in attempts) == ["cancelled", "cancelled"]
