"""A worker's view of what was cancelled (conveyor/control/watch.py), over the records in a
SQLite file and the poll channel: no server needed."""

from __future__ import annotations

import time
from pathlib import Path

from conveyor import limits
from conveyor.control import CANCEL_TTL, CancelResult
from conveyor.control.channel import Poll
from conveyor.control.watch import CancelWatch
from conveyor.limits import Limiter
from tests.support import wait_for


def test_the_watch_knows_old_records_at_start_and_hears_new_ones(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/limits.db"

    def open_records() -> Limiter:
        return limits.from_url(url)

    writer = open_records()
    writer.cancel("before", time.time(), CANCEL_TTL)
    heard: list[str] = []
    watch = CancelWatch(Poll(open_records), open_records, heard.append).start()
    try:
        assert "before" in watch and heard == ["before"]  # read before the first delivery
        assert "later" not in watch
        writer.cancel("later", time.time(), CANCEL_TTL)
        wait_for(lambda: "later" in watch, 30, "the watch to hear of the new cancel")
        writer.cancel("later", time.time(), CANCEL_TTL)  # again: not a second call
        time.sleep(0.6)
        assert heard == ["before", "later"]
    finally:
        watch.close()
        writer.close()


def test_a_watch_started_behind_knows_old_records_once_its_first_read_is_done(
        tmp_path: Path) -> None:
    """A worker starts it behind its pool's start-up and waits for the read before its
    first delivery; one closed at once (the pool failed) still ends its thread."""
    url = f"sqlite:///{tmp_path}/limits.db"

    def open_records() -> Limiter:
        return limits.from_url(url)

    writer = open_records()
    writer.cancel("before", time.time(), CANCEL_TTL)
    heard: list[str] = []
    watch = CancelWatch(Poll(open_records), open_records, heard.append).start_behind()
    try:
        watch.wait_read()
        assert "before" in watch and heard == ["before"]
    finally:
        watch.close()
        writer.close()
    closed_at_once = CancelWatch(Poll(open_records), open_records).start_behind()
    closed_at_once.close()
    closed_at_once.wait_read()
    wait_for(lambda: not closed_at_once._thread.is_alive(), 30, "the watch's thread to end")


def test_a_watch_whose_store_is_down_starts_and_reads_it_once_it_is_up(
        tmp_path: Path) -> None:
    """The worker starts without the records (said once) and reads them when it can."""
    url = f"sqlite:///{tmp_path}/limits.db"
    up = False

    def open_records() -> Limiter:
        if not up:
            raise ConnectionError("the store is down")
        return limits.from_url(url)

    watch = CancelWatch(Poll(open_records), open_records).start()
    try:
        assert "m1" not in watch
        up = True
        writer = open_records()
        writer.cancel("m1", time.time(), CANCEL_TTL)
        wait_for(lambda: "m1" in watch, 10, "the watch to read the records once up")
        writer.close()
    finally:
        watch.close()


def test_the_results_say_what_a_cancel_did() -> None:
    assert CancelResult.FINISHED.describe("m1") == "m1 has finished already: nothing changed"
    assert CancelResult("already_cancelled") is CancelResult.ALREADY_CANCELLED
