"""The autoscaler's journal: evaluations written when they change (or once a minute),
replica changes kept with their reasons, and a store that fails never raising."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conveyor.autoscaler.journal import KEEPALIVE, RETENTION, Evaluation, Journal
from conveyor.state.store import Store

T0 = 1_700_000_000.0


EVALUATION = Evaluation(target="workers", kind="local", queues="default,heavy", replicas=1,
                        desired=2, min_replicas=0, max_replicas=4, ready=7, in_flight=1,
                        reason="7 ready + 1 in flight over 4 slots per replica", error=None,
                        polling_interval=5.0)


def test_an_unchanged_evaluation_is_written_once_per_keepalive(
        store: Store, state_url: str) -> None:
    now = [T0]
    journal = Journal(state_url, clock=lambda: now[0])
    journal.evaluated(EVALUATION)
    now[0] = T0 + 5
    journal.evaluated(EVALUATION)                          # the same: not written
    now[0] = T0 + KEEPALIVE + 1
    journal.evaluated(EVALUATION)                          # the keepalive is due
    now[0] += 5
    journal.evaluated(replace(EVALUATION, replicas=2))     # changed: written at once
    journal.close()
    [row] = store.rows("scalers")
    assert row["evaluated_at"] == T0 + KEEPALIVE + 6 and row["replicas"] == 2
    assert (row["queues"], row["desired"], row["ready"], row["in_flight"], row["error"]) == (
        "default,heavy", 2, 7, 1, None)


def test_replica_changes_are_kept_newest_first_and_forgotten_after_retention(
        store: Store, state_url: str) -> None:
    now = [T0]
    journal = Journal(state_url, clock=lambda: now[0])
    journal.scaled("workers", 0, 1, "activated: 3 ready + 0 in flight > activation threshold 0")
    now[0] = T0 + 60
    journal.scaled("workers", 1, 3, "9 ready + 3 in flight over 4 slots per replica")
    journal.evaluated(replace(EVALUATION, replicas=None, desired=None, ready=None,
                              in_flight=None, reason="the target's replicas could not be read",
                              error="deployment workers: 403 Forbidden"))
    journal.close()
    rows = store.rows("recent_scalings", limit=10)
    assert [(r["at"], r["from_replicas"], r["to_replicas"]) for r in rows] == [
        (T0 + 60, 1, 3), (T0, 0, 1)]
    [target] = store.rows("scalers")
    assert target["replicas"] is None and target["error"] == "deployment workers: 403 Forbidden"

    later = Journal(state_url, clock=lambda: T0 + RETENTION + 30)
    later.scaled("workers", 3, 2, "stabilised")
    later.close()
    assert [r["to_replicas"] for r in store.rows("recent_scalings", limit=10)] == [2, 3]


def test_an_unreachable_store_is_logged_once_and_never_raises(
        caplog: pytest.LogCaptureFixture) -> None:
    journal = Journal("postgresql://nobody@127.0.0.1:1/none")
    journal.evaluated(EVALUATION)
    journal.scaled("workers", 0, 1, "activated")
    journal.close()
    warned = [r for r in caplog.records if "cannot record decisions" in r.message]
    assert len(warned) == 1
