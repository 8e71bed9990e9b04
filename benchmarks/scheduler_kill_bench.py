#!/usr/bin/env python
"""Two schedulers, one of them SIGKILLed again and again, a DAG run going on (issue 27).

usage: python benchmarks/scheduler_kill_bench.py [--broker sqlite|redis|postgres|rabbitmq]
           [--state sqlite|postgres] [--tasks 160] [--task-seconds 0.5] [--kill-every 1.5]
           [--lease 5] [--json]

A run of `--tasks` command tasks in chains of four (each appends its name to a ledger, then
sleeps `--task-seconds`) on a `conveyor worker` with 4 slots; two `conveyor scheduler`
processes share the work, and every `--kill-every` seconds one of them, chosen at random, is
killed with SIGKILL and started again. Prints: the kills, the run's duration, the longest
wait of a task instance between being claimed for publishing and being published (the wait
of an attempt a killed scheduler claimed: 60 s before the scheduler lease) and between
being queued and starting (that, plus waiting for one of the 4 slots), and how many task
bodies ran more than once (an attempt published twice by a scheduler killed between its
publish and recording it; see the README's "A scheduler killed mid-dispatch").

Names are unique per run; queues, schemas and the temporary directory are removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.*
from conveyor.state.store import from_url  # noqa: E402
from tests.conftest import (  # noqa: E402
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    clean_transport,
    drop_postgres_schema,
)

BROKERS = {"sqlite": "sqlite:///{tmp}/broker.db", "redis": REDIS_URL + "?prefix={name}",
           "postgres": POSTGRES_URL + "?schema={name}b", "rabbitmq": RABBITMQ_URL}
STATES = {"sqlite": "sqlite:///{tmp}/state.db", "postgres": POSTGRES_URL + "?schema={name}s"}


def dag_file(folder: Path, ledger: Path, tasks: int, seconds: float, queue: str) -> None:
    lines = ["from conveyor.scheduler import DAG",
             "dag = DAG('killbench', retries=3, retry_delay=1)", "prev = None"]
    for i in range(tasks):
        lines += [f"t = dag.command('t{i:03d}', ['sh', '-c', 'echo t{i:03d} >> {ledger}; "
                  f"sleep {seconds:g}'], queue={queue!r})",
                  f"if prev is not None and {i % 4}: prev >> t", "prev = t"]
    folder.mkdir()
    (folder / "killbench.py").write_text("\n".join(lines) + "\n")


def conveyor(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "conveyor.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(args: argparse.Namespace, tmp: Path, name: str) -> dict[str, Any]:
    broker = BROKERS[args.broker].format(tmp=tmp, name=name)
    state = STATES[args.state].format(tmp=tmp, name=name)
    ledger, queue = tmp / "ledger", f"work-{name}"
    dag_file(tmp / "dags", ledger, args.tasks, args.task_seconds, queue)
    env = {**os.environ, "CONVEYOR_BROKER_URL": broker, "CONVEYOR_STATE_URL": state,
           "CONVEYOR_DAGS_FOLDER": str(tmp / "dags"), "CONVEYOR_LOG_LEVEL": "WARNING",
           "CONVEYOR_SCHEDULER_EVENT_LEASE": str(args.lease),
           "CONVEYOR_EVENTS_QUEUE": f"events-{name}",
           "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{name}",
           "CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0"}
    worker = conveyor("worker", "--queues", queue, "--concurrency", "4", env=env)
    schedulers = [conveyor("scheduler", env=env) for _ in range(2)]
    store = from_url(state)
    kills = 0
    try:
        time.sleep(2)
        done = subprocess.run([sys.executable, "-m", "conveyor.cli", "dags", "trigger",
                               "killbench", "--json"], env=env, capture_output=True,
                              text=True, check=True)
        run_id = json.loads(done.stdout)["run_id"]
        started = time.monotonic()
        while store.one("run", run_id=run_id)["state"] in ("queued", "running"):
            if time.monotonic() - started > 600:
                raise SystemExit("the run did not end within 600 s")
            time.sleep(args.kill_every)
            victim = random.randrange(2)
            schedulers[victim].send_signal(signal.SIGKILL)
            schedulers[victim].wait()
            schedulers[victim] = conveyor("scheduler", env=env)
            kills += 1
        took = time.monotonic() - started
        run = store.one("run", run_id=run_id)
        tis = store.rows("run_tis", run_id=run_id)
        attempts = store.rows("run_attempts", run_id=run_id)
    finally:
        store.close()
        for proc in [*schedulers, worker]:
            proc.send_signal(signal.SIGTERM)
        for proc in [*schedulers, worker]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    waits = [a["started_at"] - a["queued_at"] for a in [*attempts, *tis]
             if a.get("started_at") and a.get("queued_at")]
    unpublished = [t["published_at"] - t["queued_at"] for t in tis
                   if t.get("published_at") and t.get("queued_at")]
    runs = Counter(ledger.read_text().split()) if ledger.exists() else Counter()
    return {"broker": args.broker, "state": args.state, "tasks": args.tasks, "kills": kills,
            "run_state": run["state"], "seconds": round(took, 1),
            "longest_claimed_to_published": round(max(unpublished, default=0.0), 2),
            "longest_queued_to_started": round(max(waits, default=0.0), 2),
            "tasks_not_run": args.tasks - len(runs),
            "bodies_run_twice_or_more": sum(1 for n in runs.values() if n > 1),
            "attempts_beyond_first": sum(t["attempt"] - 1 for t in tis)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", choices=sorted(BROKERS), default="sqlite")
    p.add_argument("--state", choices=sorted(STATES), default="sqlite")
    p.add_argument("--tasks", type=int, default=160)
    p.add_argument("--task-seconds", type=float, default=0.5)
    p.add_argument("--kill-every", type=float, default=1.5)
    p.add_argument("--lease", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    name = "k" + uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="conveyor-killbench-") as tmp:
        try:
            figures = measure(args, Path(tmp), name)
        finally:
            clean_transport(args.broker, f"{name}b" if args.broker == "postgres" else name)
            if args.state == "postgres":
                drop_postgres_schema(f"{name}s")
    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        print(f"{key:>28}: {value}")


if __name__ == "__main__":
    main()
