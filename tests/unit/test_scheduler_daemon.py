"""The daemon's waker (one thread that calls wake() when the earliest deadline arrives), and
its looks at the DAGs folder."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from conveyor import broker as brokers
from conveyor.scheduler.daemon import Daemon, Waker
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.folder import DagFolder
from conveyor.state import store as stores
from tests.support import RecordingExecutor


def test_the_earliest_deadline_wins_and_fires_once() -> None:
    woke = threading.Event()
    waker = Waker(woke.set)
    try:
        now = time.time()
        waker.at(now + 30)
        waker.at(now + 0.05)          # earlier: replaces
        waker.at(now + 10)            # later: ignored
        assert woke.wait(30)
        assert waker.fired() and not waker.fired()
        woke.clear()
        assert not woke.wait(0.2)     # nothing else was due soon
    finally:
        waker.close()


def test_replace_moves_the_alarm_later_and_none_clears_it() -> None:
    woke = threading.Event()
    waker = Waker(woke.set)
    try:
        waker.at(time.time() + 0.05)
        waker.at(None, replace=True)
        assert not woke.wait(0.3)
        waker.at(time.time() - 1, replace=True)   # already due: fires at once
        assert woke.wait(30)
    finally:
        waker.close()


def test_a_look_at_the_dags_folder_reaches_the_engine_the_store_and_the_executors(
        tmp_path: Path) -> None:
    """Hot reload inside the daemon: a changed file's new version is recorded in the store
    and scheduled, executors hear of the task modules, the error count is reported."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "a.py").write_text(ONE_TASK.format(schedule=None))
    folder = DagFolder(dags, ("queue",))
    folder.refresh()

    class Apps(RecordingExecutor):
        apps: list[list[str]] = []

        def use_apps(self, apps: Sequence[str]) -> None:
            self.apps.append(list(apps))

    store = stores.from_url(f"sqlite:///{tmp_path}/state.db")
    executor = Apps()
    engine = Engine(store, {"queue": executor}, dags=folder.dags)
    daemon = Daemon(engine, brokers.from_url(f"sqlite:///{tmp_path}/broker.db"),
                    {"queue": executor}, events_queue="events", control_queue="control")
    reported: list[int] = []
    daemon.on_reloaded = reported.append
    try:
        engine.sync_dags(time.time())
        daemon.watch(folder, 0)                  # looks only when asked (SIGHUP)
        assert not daemon._look()
        (dags / "a.py").write_text(ONE_TASK.format(schedule="'0 3 * * *'"))
        (dags / "b.py").write_text("raise ValueError('broken')\n")
        daemon.reload()
        assert daemon._look()
        [row] = store.rows("dags")
        assert (row["version"], row["schedule"]) == (folder.dags["a"].version, "0 3 * * *")
        assert engine.dags["a"] is folder.dags["a"]
        assert executor.apps == [[]] and reported == [1]
        assert not daemon._look()                # nothing asked since
    finally:
        daemon.close()


ONE_TASK = '''
from conveyor.scheduler import DAG

dag = DAG("a", schedule={schedule})
dag.command("t", ["true"])
'''
