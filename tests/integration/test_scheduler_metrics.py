"""The scheduler's /metrics, scraped from a real scheduler process running a real DAG."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from tests.support import conveyor, free_port, spawn, stop, wait_for


def sample(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_metrics_show_states_lag_dispatch_latency_and_load_errors(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "hop.py").write_text("from conveyor.scheduler import DAG\n"
                                 "dag = DAG('hop')\n"
                                 "dag.command('a', ['true']) >> dag.command('b', ['true'])\n")
    (dags / "broken.py").write_text("raise RuntimeError('no')\n")
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db",
           "CONVEYOR_STATE_URL": f"sqlite:///{tmp_path}/state.db",
           "CONVEYOR_DAGS_FOLDER": str(dags), "CONVEYOR_EXECUTORS": "local"}
    port = free_port()
    scheduler = spawn("scheduler", "--metrics-port", str(port), "--log-level", "WARNING",
                      env=env)
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())

    try:
        wait_for(scrape, what="/metrics to answer", ignore=(OSError,))
        run = json.loads(conveyor("dags", "trigger", "hop", "--wait", "--timeout", "60",
                                  "--json", env=env, check=False).stdout)
        assert run["run"]["state"] == "success", run
        text = scrape()
    finally:
        stop(scheduler)
    assert sample(text, "conveyor_scheduler_runs", '{state="success"}') == 1
    assert sample(text, "conveyor_scheduler_task_instances", '{state="success"}') == 2
    assert sample(text, "conveyor_scheduler_dag_load_errors") == 1
    assert sample(text, "conveyor_scheduler_dispatch_latency_seconds_count") == 1   # a -> b
    assert sample(text, "conveyor_scheduler_event_lag_seconds_count") >= 4   # 2 starts, 2 ends
