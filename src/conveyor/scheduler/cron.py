"""Cron schedules: when a DAG's next run is due, computed with croniter in the DAG's zone.

Times are Unix seconds in and out; the zone only decides where "3 a.m." falls.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter


def problem(expr: str, timezone: str = "UTC") -> str:
    """Why `expr` (in `timezone`) cannot be a schedule, or "" when it can."""
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return f"timezone {timezone!r} is not an IANA zone name (e.g. 'UTC', 'Europe/Paris')"
    if not croniter.is_valid(expr):
        return (f"schedule {expr!r} is not a cron expression: use five fields "
                "'minute hour day-of-month month day-of-week', e.g. '0 3 * * *'")
    return ""


def next_tick(expr: str, after: float, timezone: str = "UTC") -> float:
    """The first tick strictly after `after`."""
    start = datetime.fromtimestamp(after, ZoneInfo(timezone))
    return float(croniter(expr, start).get_next(float))


def latest_tick(expr: str, now: float, timezone: str = "UTC") -> float:
    """The last tick at or before `now`: the logical date of the run due now."""
    start = datetime.fromtimestamp(now, ZoneInfo(timezone))
    previous = float(croniter(expr, start).get_prev(float))
    following = next_tick(expr, previous, timezone)
    return following if following <= now else previous
