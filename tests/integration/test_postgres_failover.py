"""Postgres failover under a running scheduler and workers (issue 31): the primary is killed
with `kill -9` mid-run and its synchronous standby promoted; everything continues on the new
primary with nothing lost and every transition exactly once.

The cluster is the test's own (pg_standby.py: initdb, pg_basebackup -R, private ports,
`synchronous_standby_names='*'`), made once for the module. The broker and the state store
are both on it, through the one multi-host URL (`postgresql://h1:p1,h2:p2/postgres`, libpq's),
so `conveyor scheduler`, two `conveyor worker` processes and `conveyor dags trigger` all take
that URL. The DAG's tasks append `start` and `done` lines to a ledger; the primary dies when
part of the first fan-out is done, others run, and the rest wait in the queue.

Asserted: the scheduler and the workers are the same processes at the end (they followed
the failover, nobody restarted them); the run succeeds; every task ran to `done` exactly once
(no success re-run) with one attempt recorded; figures printed: time from the kill to the first
task started on the new primary (resume), to the run's end, and the module's wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.state.store import from_url
from tests.integration.pg_standby import Pair, standby_pair
from tests.support import conveyor, stop, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WIDTH = 16   # tasks per fan-out
SECONDS = 0.4   # each task's run
WORKERS, CONCURRENCY = 2, 4
MODULE_STARTED = time.monotonic()


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    cluster = standby_pair()
    yield cluster
    cluster.close()
    print(f"\npostgres failover module: {time.monotonic() - MODULE_STARTED:.1f} s wall")


def dag_source(ledger: Path) -> str:
    """root >> WIDTH tasks >> mid >> WIDTH tasks >> join, each writing start and done lines."""
    line = f'echo "$0 $1 $(date +%s.%N)" >> {ledger}'
    return (
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('ha', retries=0)\n"
        "def step(name):\n"
        f"    script = '{line.replace('$0', 'start')}; sleep {SECONDS}; "
        f"{line.replace('$0', 'done')}'\n"
        "    return dag.command(name, ['sh', '-c', script, 'sh', name])\n"
        "mid = step('mid')\n"
        f"step('root') >> [step(f'a{{i}}') for i in range({WIDTH})] >> mid\n"
        f"mid >> [step(f'b{{i}}') for i in range({WIDTH})] >> step('join')\n")


def ledger(path: Path) -> list[tuple[str, str, float]]:
    """(start|done, task, unix time) per line written so far."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(r[0], r[1], float(r[2])) for r in rows if len(r) == 3]


def spawn_logged(log: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`conveyor ARGS…` in the background, its output in `log` (read when a wait fails)."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "conveyor.cli", *args],
                                env={**os.environ, **env}, stdout=out, stderr=out)


def tails(logs: list[Path]) -> str:
    return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                     for p in logs if p.exists())


def test_kill_9_of_the_primary_and_promotion_of_the_standby_lose_and_rerun_nothing(
        pair: Pair, tmp_path: Path) -> None:
    book = tmp_path / "ledger"
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "ha.py").write_text(dag_source(book))
    env = {"CONVEYOR_BROKER_URL": f"{pair.url}?schema=ha_broker",
           "CONVEYOR_STATE_URL": f"{pair.url}?schema=ha_state",
           "CONVEYOR_DAGS_FOLDER": str(tmp_path / "dags"), "CONVEYOR_LOG_LEVEL": "INFO"}
    logs = [tmp_path / f"worker{n}.log" for n in range(WORKERS)] + [tmp_path / "scheduler.log"]
    procs = [spawn_logged(logs[n], "worker", "--queues", "default", "--concurrency",
                          str(CONCURRENCY), env=env) for n in range(WORKERS)]
    procs.append(spawn_logged(logs[-1], "scheduler", env=env))
    try:
        run_id = json.loads(conveyor("dags", "trigger", "ha", "--json", env=env).stdout)["run_id"]
        wait_for(lambda: sum(1 for kind, task, _ in ledger(book)
                             if kind == "done" and task.startswith("a")) >= WIDTH // 3,
                 60, "a third of the first fan-out done", detail=lambda: tails(logs))
        crashed = pair.crash_primary()
        pair.promote()
        promoted = time.time()
        store = from_url(env["CONVEYOR_STATE_URL"])   # the multi-host URL: the new primary
        try:
            wait_for(lambda: (store.one("run", run_id=run_id) or {}).get("state") == "success",
                     120, "the run to succeed on the new primary", detail=lambda: tails(logs))
            ended = time.time()
            attempts = store.rows("run_attempts", run_id=run_id)
            tis = store.rows("run_tis", run_id=run_id)
        finally:
            store.close()
        alive = [proc.poll() is None for proc in procs]
    finally:
        for proc in procs:
            stop(proc)

    tasks = {"root", "mid", "join", *(f"{x}{i}" for x in "ab" for i in range(WIDTH))}
    lines = ledger(book)
    done = Counter(task for kind, task, _ in lines if kind == "done")
    started = Counter(task for kind, task, _ in lines if kind == "start")
    # Resumed: the first task the scheduler queued after the kill (only the new primary can
    # have committed that) started on a worker (claimed from the new primary).
    queued_after = {ti["task_id"] for ti in tis if (ti["queued_at"] or 0) > crashed}
    resumed = min((at for kind, task, at in lines if kind == "start" and task in queued_after),
                  default=float("nan"))
    in_flight = {t for k, t, at in lines if k == "start" and at < crashed} - {
        t for k, t, at in lines if k == "done" and at < crashed}
    print(f"\npostgres failover: kill -9 -> promoted {promoted - crashed:.2f} s; -> first task "
          f"queued and started on the new primary {resumed - crashed:.2f} s; -> run ended "
          f"{ended - crashed:.2f} s; {len(in_flight)} tasks in flight at the kill; lost "
          f"{len(tasks - set(done))}; success re-runs {sum(n - 1 for n in done.values())}; "
          f"starts beyond one {sum(n - 1 for n in started.values())}")
    assert alive == [True] * len(procs), tails(logs)   # followed the failover, not restarted
    assert set(done) == tasks, f"lost: {sorted(tasks - set(done))}"
    assert all(n == 1 for n in done.values()), f"ran to success twice: {done}"
    assert {ti["state"] for ti in tis} == {"success"}
    assert len(attempts) == len(tasks) and {a["attempt"] for a in attempts} == {1}
    assert queued_after, "nothing was queued after the kill: the kill came too late to tell"
