"""A Celery result write while Redis is away: retried by tenacity, then one clear error."""

from __future__ import annotations

import logging
import time

import pytest

from conveyor.celery_intake.results import RETRY_PAUSE, RedisResults, meta
from conveyor.errors import ConveyorError


def test_a_result_write_retries_with_one_line_a_try_then_says_how_long_it_tried(
        caplog: pytest.LogCaptureFixture) -> None:
    pauses: list[float] = []

    def sleep(seconds: float) -> None:   # records the pause, and lets a little time pass
        pauses.append(seconds)
        time.sleep(0.05)

    backend = RedisResults("redis://127.0.0.1:1/0", retry_seconds=0.2, sleep=sleep)
    caplog.set_level(logging.WARNING, logger="conveyor.celery_intake")
    with pytest.raises(ConveyorError, match=r"^Celery result backend redis://127.0.0.1:1/0 "
                       r"unreachable for 0\.2 s \(.*\): results of tasks from Celery"):
        backend.store(meta("t1", "SUCCESS", 1))
    assert pauses and set(pauses) == {RETRY_PAUSE}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(pauses) and all(
        line.startswith("Celery result backend redis://127.0.0.1:1/0: ") and
        line.endswith("; retrying") for line in lines)
