#!/usr/bin/env python3
"""Deferred tasks: file appeared -> task resumed, and what a triggerer costs while it waits.

    .venv/bin/python benchmarks/deferral_bench.py [--waiters 200] [--idle 2000]
                                                   [--state postgresql://...]

A real `conveyor scheduler`, `conveyor worker --concurrency 4` and `conveyor triggerer`
(the broker on the state store's database: an SQLite file, or with `--state` a Postgres
schema of the run's own, dropped after). Figures:

- waiters: a DAG of N tasks, each deferring on a FileTrigger (poll 0.5 s) of its own file;
  once all are `deferred`, how many task instances are `running` (the slots they hold:
  0); then all N files are written at once, and per task file mtime -> queued again (its
  trigger fired and the scheduler resumed it: `queued_at`) and -> its resumed segment
  running (the task's own clock, in its result: what the worker's 4 slots add), p50 / p99
  / max, and first file -> last task running again;
- idle: M more tasks deferred on files that never come; the triggerer's RSS and its CPU
  over 10 s (share of one core) with all of them running as coroutines.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from conveyor.config import Settings
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import poke
from conveyor.scheduler.folder import load_folder
from conveyor.scheduler.runs import create_run
from conveyor.state.store import Store, from_url

DAGS = '''
import time

from conveyor import DAG, Defer, context, task
from conveyor.triggers import FileTrigger

FILES = {files!r}


@task(name="deferbench.wait", max_retries=0)
def wait(name):
    event = context.trigger_event
    if event is None:
        raise Defer(FileTrigger(FILES + "/" + name), timeout=3600)
    return {{"resumed_at": time.time(), "mtime": event["mtime"]}}


waiters = DAG("bench_waiters")
waiters.task(wait, id="w").expand(name=[f"w{{i}}" for i in range({waiters})])
idle = DAG("bench_idle")
idle.task(wait, id="i").expand(name=[f"never{{i}}" for i in range({idle})])
'''


def states(store: Store, run_id: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for row in store.rows("run_tis", run_id=run_id):
        if row["map_index"] is not None:
            found[row["state"]] = found.get(row["state"], 0) + 1
    return found


def running(store: Store, *run_ids: str) -> int:
    """Mapped instances running (a mapped task's own row stays `running`: it holds none)."""
    return sum(states(store, run_id).get("running", 0) for run_id in run_ids)


def wait_until(check: Any, what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def figures(name: str, waits: list[float]) -> str:
    ms = sorted(w * 1000 for w in waits)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (f"{name}: n={len(ms)}  p50 {statistics.median(ms):.0f} ms  p99 {p99:.0f} ms  "
            f"max {ms[-1]:.0f} ms")


def rss_and_cpu(pid: int, seconds: float = 10.0) -> tuple[float, float]:
    """(RSS in MiB, CPU over `seconds` as a share of one core)."""
    def ticks() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    before, start = ticks(), time.monotonic()
    time.sleep(seconds)
    used = (ticks() - before) / os.sysconf("SC_CLK_TCK")
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text()
               .splitlines() if line.startswith("VmRSS:"))
    return rss / 1024, used / (time.monotonic() - start)


def start_run(store: Store, config: SchedulerConfig, dags_folder: Path, dag_id: str) -> str:
    dag = load_folder(str(dags_folder), ["queue"]).dags[dag_id]
    run_id = create_run(store, dag, time.time(), executors=["queue"])
    poke(config, "")
    return str(run_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=200)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--state", default="", help="a postgresql:// URL (default: SQLite)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))   # the children are stopped too
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        schema = f"db{uuid.uuid4().hex[:8]}"
        if args.state:
            state, broker = f"{args.state}?schema={schema}", f"{args.state}?schema={schema}b"
        else:
            state, broker = f"sqlite:///{tmp}/state.db", f"sqlite:///{tmp}/broker.db"
        (tmp / "dags").mkdir()
        (tmp / "files").mkdir()
        (tmp / "dags" / "deferbench.py").write_text(DAGS.format(
            files=str(tmp / "files"), waiters=args.waiters, idle=args.idle))
        env = {**os.environ, "CONVEYOR_BROKER_URL": broker, "CONVEYOR_STATE_URL": state,
               "CONVEYOR_DAGS_FOLDER": str(tmp / "dags"), "CONVEYOR_LOG_LEVEL": "WARNING",
               "CONVEYOR_MAX_MAP_LENGTH": str(max(args.waiters, args.idle))}
        procs = [subprocess.Popen([sys.executable, "-m", "conveyor.cli", *cmd], env=env,
                                  stdout=subprocess.DEVNULL)
                 for cmd in (["worker", "--concurrency", "4"], ["scheduler"],
                             ["triggerer", "--poll", "0.5"])]
        store = from_url(state)
        config = SchedulerConfig(settings=Settings(broker_url=broker, state_url=state))
        try:
            bench(store, config, tmp, args.waiters, args.idle, procs[2].pid)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(60)
            store.close()
            if args.state:
                from tests.conftest import drop_postgres_schema
                drop_postgres_schema(schema)
                drop_postgres_schema(f"{schema}b")


def bench(store: Store, config: SchedulerConfig, tmp: Path, n: int, idle: int,
          triggerer: int) -> None:
    run_id = start_run(store, config, tmp / "dags", "bench_waiters")
    wait_until(lambda: states(store, run_id).get("deferred", 0) == n, f"{n} tasks deferred")
    print(f"{n} tasks deferred; instances running (slots held): {running(store, run_id)}")
    started = time.time()
    for i in range(n):
        (tmp / "files" / f"w{i}").write_text("x")
    wait_until(lambda: states(store, run_id).get("success", 0) == n, f"{n} tasks resumed")
    rows = [row for row in store.rows("run_tis", run_id=run_id) if row["map_index"] is not None]
    results = [json.loads(row["result"]) for row in rows]
    print(figures("file -> queued again (trigger fired, scheduler resumed it)",
                  [row["queued_at"] - r["mtime"] for row, r in zip(rows, results, strict=True)]))
    print(figures("file -> running again (a worker slot took it)",
                  [r["resumed_at"] - r["mtime"] for r in results]))
    last = max(r["resumed_at"] for r in results)
    print(f"first file -> last task resumed: {(last - started) * 1000:.0f} ms")
    idle_run = start_run(store, config, tmp / "dags", "bench_idle")
    wait_until(lambda: states(store, idle_run).get("deferred", 0) == idle,
               f"{idle} idle tasks deferred", timeout=1800)
    time.sleep(3)   # the triggerer claims them (poll 0.5 s) and starts their coroutines
    rss, cpu = rss_and_cpu(triggerer)
    print(f"{idle} deferred: instances running {running(store, idle_run)}; triggerer RSS "
          f"{rss:.0f} MiB, CPU {cpu * 100:.1f}% of a core over 10 s")


if __name__ == "__main__":
    main()
