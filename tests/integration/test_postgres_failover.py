"""Postgres failover under a running scheduler and workers (issue 31): the primary is killed
with `kill -9` mid-run and its synchronous standby promoted; everything continues on the new
primary with nothing lost and every transition exactly once.

The cluster is the test's own (pg_standby.py: initdb, pg_basebackup -R, private ports,
`synchronous_standby_names='*'`), made once for the module. The broker and the state store
are both on it, through the one multi-host URL (`postgresql://h1:p1,h2:p2/postgres`, libpq's),
so `conveyor scheduler`, two `conveyor worker` processes and `conveyor dags trigger` all take
that URL. The DAG's tasks append `start` and `done` lines to a ledger; the primary dies when
part of the first fan-out is done, others run, and the rest wait in the queue. Meanwhile a
`Client` enqueues `t.record` tasks through the same URL, across the failover.

Asserted: the scheduler and the workers are the same processes at the end (they followed
the failover, nobody restarted them); the run succeeds; every task ran to `done` exactly once
(no success re-run) with one attempt recorded; every enqueue that returned ran (done at least
once; twice only if its enqueue spanned the failover: at-least-once publish); figures printed:
time from the kill to the first task queued and started on the new primary (resume), to the
run's end, the publisher's losses and duplicates, and the module's wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import from_url as from_broker_url
from conveyor.client import Client
from conveyor.state.store import from_url
from tests.integration.pg_standby import Pair, standby_pair
from tests.integration.workerkit import task_message
from tests.support import conveyor, stop, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WIDTH = 16   # tasks per fan-out
SECONDS = 0.4   # each task's run
WORKERS, CONCURRENCY = 2, 4
PUBLISHED = 150   # messages a publisher sends, one every 50 ms, across the failover


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    started = time.monotonic()
    cluster = standby_pair()
    yield cluster
    cluster.close()
    print(f"\npostgres failover module: {time.monotonic() - started:.1f} s wall (cluster made, "
          "tests run, cluster gone)")


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


def records(path: Path) -> list[tuple[str, str]]:
    """(start|done, token) per line t.record wrote so far."""
    if not path.exists():
        return []
    return [(r[0], r[1]) for r in (line.split() for line in path.read_text().splitlines())
            if len(r) >= 2]


def spawn_logged(log: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`conveyor ARGS…` in the background, its output in `log` (read when a wait fails)."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "conveyor.cli", *args],
                                env={**os.environ, **env}, stdout=out, stderr=out)


def tails(logs: list[Path]) -> str:
    return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                     for p in logs if p.exists())


class Publisher(threading.Thread):
    """`Client.enqueue` of `t.record` messages, one every 50 ms, through the multi-host URL
    and across the failover (a publish blocks while no primary answers, then goes on)."""

    def __init__(self, url: str, log: Path) -> None:
        super().__init__(daemon=True)
        self.url, self.log = url, log
        self.confirmed: list[str] = []   # tokens whose enqueue returned
        self.spans: list[tuple[float, float]] = []   # each enqueue's (began, returned)
        self.slow: set[str] = set()   # tokens whose enqueue took long: spanned the failover
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            client = Client(from_broker_url(self.url))
            for n in range(PUBLISHED):
                began = time.time()
                client.enqueue(task_message("t.record", "direct", str(self.log), f"m{n}"))
                self.spans.append((began, time.time()))
                if time.time() - began > 0.5:
                    self.slow.add(f"m{n}")
                self.confirmed.append(f"m{n}")
                time.sleep(0.05)
            client.broker.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_kill_9_of_the_primary_and_promotion_of_the_standby_lose_and_rerun_nothing(
        pair: Pair, tmp_path: Path) -> None:
    book = tmp_path / "ledger"
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "ha.py").write_text(dag_source(book))
    env = {"CONVEYOR_BROKER_URL": f"{pair.url}?schema=ha_broker",
           "CONVEYOR_STATE_URL": f"{pair.url}?schema=ha_state",
           "CONVEYOR_DAGS_FOLDER": str(tmp_path / "dags"), "CONVEYOR_LOG_LEVEL": "INFO"}
    logs = [tmp_path / f"worker{n}.log" for n in range(WORKERS)] + [tmp_path / "scheduler.log"]
    procs = [spawn_logged(logs[n], "worker", "--queues", "default,direct", "--concurrency",
                          str(CONCURRENCY), "--app", "tests.integration.worker_tasks", env=env)
             for n in range(WORKERS)]
    publisher = Publisher(env["CONVEYOR_BROKER_URL"], tmp_path / "published")
    procs.append(spawn_logged(logs[-1], "scheduler", env=env))
    try:
        run_id = json.loads(conveyor("dags", "trigger", "ha", "--json", env=env).stdout)["run_id"]
        publisher.start()
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
            publisher.join(120)
            wait_for(lambda: {t for k, t in records(publisher.log) if k == "done"}
                     >= set(publisher.confirmed), 60, "every confirmed publish done",
                     detail=lambda: tails(logs))
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
    published = Counter(t for k, t in records(publisher.log) if k == "done")
    after = [(b, e) for b, e in publisher.spans if e > crashed]
    print(f"\npostgres failover, a publisher across it: {len(publisher.confirmed)} confirmed "
          f"({len(after)} after the kill, the first returning {after[0][1] - crashed:.2f} s "
          f"after it), lost {len(set(publisher.confirmed) - set(published))}, done twice "
          f"{sum(n > 1 for n in published.values())}")
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
    assert publisher.error is None and len(publisher.confirmed) == PUBLISHED, publisher.error
    twice = {t for t, n in published.items() if n > 1}
    assert twice <= publisher.slow, f"published once, done twice: {twice - publisher.slow}"
    assert after, "the publisher was done before the kill: it told nothing"
