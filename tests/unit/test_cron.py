"""Cron schedules: next and latest ticks, in a zone."""

from __future__ import annotations

from datetime import UTC, datetime

from conveyor.scheduler import cron


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_next_tick_is_strictly_after() -> None:
    assert cron.next_tick("0 3 * * *", ts("2024-05-01T02:59:59")) == ts("2024-05-01T03:00:00")
    assert cron.next_tick("0 3 * * *", ts("2024-05-01T03:00:00")) == ts("2024-05-02T03:00:00")


def test_latest_tick_includes_now() -> None:
    assert cron.latest_tick("*/5 * * * *", ts("2024-05-01T10:07:00")) == ts("2024-05-01T10:05:00")
    assert cron.latest_tick("*/5 * * * *", ts("2024-05-01T10:10:00")) == ts("2024-05-01T10:10:00")


def test_timezone_moves_the_hour() -> None:
    # 03:00 in Paris in May (UTC+2) is 01:00 UTC
    assert cron.next_tick("0 3 * * *", ts("2024-05-01T00:00:00"), "Europe/Paris") == \
        ts("2024-05-01T01:00:00")


def test_problems_are_explained() -> None:
    assert cron.problem("0 3 * * *") == ""
    assert "five fields" in cron.problem("every day")
    assert "IANA" in cron.problem("0 3 * * *", "Nowhere/Else")
