"""The control channel on every transport: a cancel reaches a subscribed worker's watch
within a second, and one made while the watch was not listening is read when it listens
again (conveyor/control)."""

from __future__ import annotations

import time
from pathlib import Path

from conveyor import limits
from conveyor.control import CANCEL_TTL
from conveyor.control.for_broker import for_broker
from conveyor.control.watch import CancelWatch
from conveyor.limits import Limiter
from conveyor.locations import store_urls
from tests.support import wait_for


def test_a_cancel_reaches_a_listening_worker_within_a_second(broker_url: str,
                                                              tmp_path: Path) -> None:
    records_url = store_urls(broker_url, f"sqlite:///{tmp_path}/state.db").limits

    def open_records() -> Limiter:
        return limits.from_url(records_url)

    heard: list[tuple[str, float]] = []
    watch = CancelWatch(for_broker(broker_url, open_records), open_records,
                        lambda message_id: heard.append((message_id, time.monotonic())))
    producer = open_records()
    announcer = for_broker(broker_url, open_records)
    try:
        producer.cancel("before", time.time(), CANCEL_TTL)  # made while nobody listened
        watch.start()
        assert "before" in watch
        for n in range(3):
            producer.cancel(f"m{n}", time.time(), CANCEL_TTL)
            sent = time.monotonic()
            announcer.announce(f"m{n}")
            wait_for(lambda n=n: f"m{n}" in watch, 30, "the cancel to reach the watch")
            assert heard[-1][0] == f"m{n}" and heard[-1][1] - sent < 1.0, heard
    finally:
        watch.close()
        announcer.close()
        producer.close()


