"""SQLite-specific behaviour the conformance suite cannot see: a database file another process
keeps write-locked past the busy timeout is an outage, not a crash (issue 27)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from conveyor.broker import sqlite as transport
from conveyor.errors import BrokerConnectionError


def test_a_file_locked_past_the_busy_timeout_is_an_outage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(transport, "BUSY_TIMEOUT", 0.2)
    path = tmp_path / "broker.db"
    broker = transport.SQLiteBroker(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        broker.publish("q", b"one")
        steps = broker.consume(["q"], prefetch=2, timeout=0.5)
        held = next(steps)
        assert held is not None
        broker.publish("q", b"two")
        holder.execute("BEGIN EXCLUSIVE")  # another process's long write transaction
        with pytest.raises(BrokerConnectionError, match="stayed locked by another process"):
            broker.extend_lease(held)
        with pytest.raises(BrokerConnectionError, match="publish to queue 'q'"):
            broker.publish("q", b"three")
        with pytest.raises(BrokerConnectionError, match="ack of message"):
            broker.ack(held)
        assert steps.send(0.5) is None  # a claim finds nothing and says why, once
        assert any("claiming again after the next wait" in r.getMessage()
                   for r in caplog.records)
        holder.execute("ROLLBACK")
        broker.ack(held)  # the settle that was refused goes through once the lock is gone
        second = steps.send(0.5)
        assert second is not None and second.body == b"two"
        broker.ack(second)
        steps.close()
    finally:
        holder.close()
        broker.close()
