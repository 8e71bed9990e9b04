"""Catch-up and backfill with real processes: a scheduler that starts after its DAG's start
date creates each missed run, a few at a time; `dags backfill` creates a past range once."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conveyor.state.store import from_url
from tests.support import conveyor, spawn, stop


def test_a_late_scheduler_catches_up_and_a_backfill_is_idempotent(tmp_path: Path) -> None:
    hour = int(time.time() // 3600 * 3600)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "hourly.py").write_text(
        "from conveyor.scheduler import DAG\n"
        f"dag = DAG('hourly', schedule='0 * * * *', start_date={hour - 5 * 3600},\n"
        "          max_active_runs=2)\n"
        "dag.command('a', ['true'])\n")
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": f"sqlite:///{tmp_path}/state.db",
           "CONVEYOR_DAGS_FOLDER": str(dags), "CONVEYOR_EXECUTORS": "local"}
    span = ["--from", iso(hour - 10 * 3600), "--to", iso(hour - 6 * 3600)]
    first = json.loads(conveyor("dags", "backfill", "hourly", *span, "--json", env=env).stdout)
    again = json.loads(conveyor("dags", "backfill", "hourly", *span, "--json", env=env).stdout)
    assert len(first["created"]) == 5 and first["existing"] == []
    assert again["created"] == [] and len(again["existing"]) == 5

    scheduler = spawn("scheduler", "--burst", "--log-level", "WARNING", env=env)
    try:
        scheduler.wait(60)
    finally:
        assert stop(scheduler) == 0
    store = from_url(env["CONVEYOR_STATE_URL"])
    try:
        runs = store.rows("recent_runs", dag_id="hourly", state="", limit=100)
    finally:
        store.close()
    dates = sorted(int(r["logical_date"]) for r in runs)
    assert dates == [hour - h * 3600 for h in range(10, -1, -1)]   # 5 backfilled, 6 caught up
    assert {r["state"] for r in runs} == {"success"}
    assert {r["run_type"] for r in runs if r["logical_date"] < hour - 5 * 3600} == {"backfill"}


def iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
