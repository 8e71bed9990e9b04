"""Small charts over time, drawn on the server as inline SVG: no chart library, no script.

Two kinds, both with time (UTC) across and a count up: lines (queue depth as sampled, one
line per state that was ever above zero, over a grey baseline where samples exist, broken
where they are missing: the sampler was not running) and stacked bars (tasks finished per
minute, succeeded under failed). Colours come from the stylesheet through class names
(`line ready`, `bar failed`, ...), so the page's legend and the chart agree. Every shape
carries a `<title>`, which browsers show on hover.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.ui.html import e

#: The depth states, in the order of a sample after its time (see readers.queue_history).
DEPTH_STATES = ("ready", "in_flight", "delayed", "dead")
#: A gap longer than this many sampling periods breaks a line (the sampler was not running).
GAP_PERIODS = 2.5


@dataclass(frozen=True)
class Frame:
    """Where the plot sits in the SVG, and the span of time and counts it shows."""

    since: float
    until: float
    top: float                     # the count at the top edge
    width: int = 520
    height: int = 150
    left: int = 40                 # room for the count labels
    bottom: int = 20               # room for the time labels
    pad: int = 8

    def x(self, at: float) -> float:
        span = max(self.until - self.since, 1.0)
        inner = self.width - self.left - self.pad
        return round(self.left + (at - self.since) / span * inner, 1)

    def y(self, count: float) -> float:
        inner = self.height - self.bottom - self.pad
        return round(self.pad + inner - count / self.top * inner, 1)


def nice_top(largest: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above `largest` (1 for an empty chart)."""
    if largest <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(largest))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= largest))


def depth_chart(samples: Sequence[Sequence[float]], since: float, until: float,
                label: str) -> str:
    """Lines of ready, in flight, delayed and dead over time from `[at, ready, in_flight,
    delayed, dead]` samples."""
    shown = [s for s in samples if since <= s[0] <= until]
    top = nice_top(max((max(s[1:5]) for s in shown), default=0))
    frame = Frame(since, until, top)
    gap = GAP_PERIODS * _period(shown)
    drawn = [(i + 1, state) for i, state in enumerate(DEPTH_STATES)
             if any(s[i + 1] for s in shown)]   # a state at zero throughout: no line on 0
    lines = "".join(
        f'<path class="line {state}" d="{_path(frame, shown, column, gap)}">'
        f"<title>{e(state.replace('_', ' '))}</title></path>" for column, state in drawn)
    baseline = (f'<path class="line samples" d="{_path(frame, shown, 0, gap, zero=True)}">'
                f"<title>sampled, all zero</title></path>") if shown else ""
    empty = "" if shown else _note(frame, "no samples in this window")
    return _svg(frame, "depth", label, baseline + lines + empty)


def finished_chart(minutes: Sequence[Sequence[float]], since: float, until: float,
                   label: str) -> str:
    """Bars per minute from `[minute, succeeded, failed]`: succeeded below, failed on top."""
    shown = [m for m in minutes if since - 60 < m[0] <= until]
    top = nice_top(max((m[1] + m[2] for m in shown), default=0))
    frame = Frame(since, until, top)
    bars = []
    for minute, succeeded, failed in shown:
        left = max(frame.x(minute), frame.left)
        width = max(frame.x(min(minute + 60, until)) - left - 0.5, 1.0)
        tip = f"{_clock(minute)}: {succeeded:g} succeeded, {failed:g} failed"
        for cls, low, high in (("succeeded", 0, succeeded),
                               ("failed", succeeded, succeeded + failed)):
            if high > low:
                bars.append(f'<rect class="bar {cls}" x="{left}" y="{frame.y(high)}" '
                            f'width="{round(width, 1)}" '
                            f'height="{round(frame.y(low) - frame.y(high), 1)}">'
                            f"<title>{e(tip)}</title></rect>")
    empty = "" if shown else _note(frame, "no task finished in this window")
    return _svg(frame, "finished", label, "".join(bars) + empty)


def _period(samples: Sequence[Sequence[float]]) -> float:
    """The sampling period: the usual distance between samples (60 s if unknown)."""
    steps = [b[0] - a[0] for a, b in zip(samples, samples[1:], strict=False) if b[0] > a[0]]
    return statistics.median(steps) if steps else 60.0


def _path(frame: Frame, samples: Sequence[Sequence[float]], column: int, gap: float, *,
          zero: bool = False) -> str:
    """A line through the samples' `column` (or along zero), lifted where a gap is."""
    parts, last = [], None
    for sample in samples:
        move = last is None or sample[0] - last > gap
        y = frame.y(0 if zero else sample[column])
        parts.append(f"{'M' if move else 'L'}{frame.x(sample[0])},{y}")
        last = sample[0]
    return " ".join(parts)


def _svg(frame: Frame, kind: str, label: str, marks: str) -> str:
    return (f'<svg class="chart {kind}" role="img" aria-label="{e(label)}" '
            f'viewBox="0 0 {frame.width} {frame.height}" width="{frame.width}" '
            f'height="{frame.height}"><title>{e(label)}</title>{_axes(frame)}{marks}</svg>')


def _axes(frame: Frame) -> str:
    """Grid lines at 0, half and the top, with their counts; the time every 15 minutes."""
    right, base = frame.width - frame.pad, frame.y(0)
    out = []
    for count in (0.0, frame.top / 2, frame.top):
        y = frame.y(count)
        out.append(f'<line class="grid" x1="{frame.left}" x2="{right}" y1="{y}" y2="{y}"/>'
                   f'<text class="tick" x="{frame.left - 4}" y="{y + 4}" '
                   f'text-anchor="end">{count:g}</text>')
    step = 900.0 if frame.until - frame.since > 1800 else 300.0
    at = math.ceil(frame.since / step) * step
    while at <= frame.until:
        out.append(f'<text class="tick" x="{frame.x(at)}" y="{base + 14}" '
                   f'text-anchor="middle">{_clock(at)}</text>')
        at += step
    return "".join(out)


def _note(frame: Frame, text: str) -> str:
    return (f'<text class="note" x="{(frame.left + frame.width) / 2}" '
            f'y="{frame.height / 2}" text-anchor="middle">{e(text)}</text>')


def _clock(at: float) -> str:
    """HH:MM in UTC (the times the rest of the dashboard shows)."""
    return time.strftime("%H:%M", time.gmtime(at))
