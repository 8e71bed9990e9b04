"""`Broker.renew_claimed`: a consumer alive with a batch claimed keeps all of it, even the
deliveries it has not handed out yet, however short its lease."""

from __future__ import annotations

import time
from pathlib import Path

from conveyor.broker.sqlite import SQLiteBroker
from tests.support import first


def test_renewed_batch_stays_ours_past_its_short_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    mine, other = SQLiteBroker(url, lease_seconds=0.3), SQLiteBroker(url)
    try:
        for n in range(3):
            mine.publish("events", str(n).encode())
        steps = mine.consume(["events"], prefetch=3, timeout=1.0)
        held = next(steps)
        assert held is not None
        mine.renew_claimed(30.0)
        mine.extend_lease(held, 30.0)
        time.sleep(0.5)   # past the 0.3 s lease the batch was claimed with
        assert first(other, ["events"], timeout=0.3) is None
        mine.ack(held)
        steps.close()
    finally:
        mine.close()
        other.close()


def test_unrenewed_batch_returns_when_its_short_lease_runs_out(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    mine, other = SQLiteBroker(url, lease_seconds=0.3), SQLiteBroker(url)
    try:
        for n in range(3):
            mine.publish("events", str(n).encode())
        steps = mine.consume(["events"], prefetch=3, timeout=1.0)
        assert next(steps) is not None
        taken = first(other, ["events"], timeout=30.0)
        assert taken is not None
        steps.close()
    finally:
        mine.close()
        other.close()
