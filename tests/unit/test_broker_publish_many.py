"""`publish_many` on the embedded SQLite transport: one transaction for the batch, so a
publication that cannot be stored leaves none of the batch behind; and `claimed_ahead`,
what a consumer that settles in batches takes without claiming again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conveyor.broker import Publication
from conveyor.broker.sqlite import SQLiteBroker


def test_a_batch_with_one_bad_publication_stores_nothing(tmp_path: Path) -> None:
    broker = SQLiteBroker(f"sqlite:///{tmp_path}/broker.db")
    try:
        bad = Publication("work", b"two", priority=object())  # type: ignore[arg-type]
        with pytest.raises(sqlite3.Error):
            broker.publish_many([Publication("work", b"one"), bad,
                                 Publication("work", b"three")])
        assert broker.depth("work").ready == 0
        broker.publish_many([Publication("work", b"one"), Publication("work", b"two")])
        assert broker.depth("work").ready == 2      # the connection is usable again
    finally:
        broker.close()


def test_claimed_ahead_counts_what_consume_holds_back(tmp_path: Path) -> None:
    broker = SQLiteBroker(f"sqlite:///{tmp_path}/broker.db")
    try:
        broker.publish_many([Publication("work", str(n).encode()) for n in range(3)])
        steps = broker.consume(["work"], prefetch=8, timeout=1.0)
        assert next(steps) is not None and broker.claimed_ahead == 2
        taken = [steps.send(0.0), steps.send(0.0)]
        assert None not in taken and broker.claimed_ahead == 0
        steps.close()
    finally:
        broker.close()
