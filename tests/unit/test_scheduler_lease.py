"""A scheduler's lease in the state store (scheduler/lease.py), on SQLite in tmp_path."""

from __future__ import annotations

from pathlib import Path

from conveyor.scheduler.lease import FORGET_AFTER, SchedulerLease
from conveyor.state.store import from_url

T0 = 1_700_000_000.0


def test_the_lease_is_taken_at_start_renewed_and_given_up_at_close(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    store = from_url(url)
    store.exec("renew_scheduler", scheduler="dead", hostname="h", pid=1, now=T0 - 2 * FORGET_AFTER,
               lease=5.0)
    clock = [T0]
    woken: list[float | None] = []
    lease = SchedulerLease(url, "me", 5.0, woken.append, clock=lambda: clock[0])
    try:
        lease.renew()
        [row] = store.rows("schedulers")          # the long-dead one was forgotten
        assert (row["scheduler_id"], row["lease_until"]) == ("me", T0 + 5.0)
        clock[0] = T0 + 2
        lease.renew()
        assert store.rows("schedulers")[0]["lease_until"] == T0 + 7.0
        assert woken == [None, None]              # no deadline in the store yet
    finally:
        lease.close()
    assert store.rows("schedulers") == []
    store.close()


def test_an_unreachable_store_is_retried_not_raised(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the store's folder should be")
    lease = SchedulerLease(f"sqlite:///{blocked}/state.db", "me", 5.0)
    lease.renew()                                 # logs once, carries on
    lease.close()
