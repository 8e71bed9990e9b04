"""Output for people (aligned tables) or scripts (`--json`), and JSON arguments.

Every command prints through these, so a table looks the same everywhere and `--json`
always means one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

#: Narrowest a wrapped last column gets before it moves under its row.
MIN_WRAPPED_WIDTH = 30


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns under upper-case headers."""
    cells = [[c.upper() for c in columns]] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def terminal_width(wide: bool = False) -> int | None:
    """The width to wrap a table to: the terminal's (or $COLUMNS); None with `wide` (a
    command's --wide) or into a pipe, so a script or grep sees one line per row."""
    if wide or not ("COLUMNS" in os.environ or sys.stdout.isatty()):
        return None
    return shutil.get_terminal_size().columns


def wrapped_table(rows: Sequence[dict[str, Any]], columns: Sequence[str],
                  width: int | None) -> str:
    """A table whose last column (a reason, an error) is never cut: it wraps within its
    column to fit `width`, or, when the other columns leave it too little room, on indented
    lines under its row. `width` None: one line per row, however long."""
    *others, last = columns
    if width is None or not rows:
        return table(rows, columns)
    used = sum(max(len(c), *(len(str(r.get(c, ""))) for r in rows)) + 2 for c in others)
    if width - used >= MIN_WRAPPED_WIDTH:
        lines: list[dict[str, Any]] = []
        for row in rows:
            first, *more = _wrap(str(row.get(last, "")), width - used)
            lines += [{**row, last: first}, *({last: part} for part in more)]
        return table(lines, columns)
    header, *body = table(rows, others).splitlines()
    out = [f"{header}  ({last.upper()} below each row)"]
    for line, row in zip(body, rows, strict=True):
        text = str(row.get(last, ""))
        out += [line, *(f"    {part}" for part in _wrap(text, width - 4) if part)]
    return "\n".join(out)


def _wrap(text: str, width: int) -> list[str]:
    """Lines of at most `width`, broken at spaces only: an id, a path or a URL longer than
    the line stays whole (copy-pasteable), overflowing instead."""
    return textwrap.wrap(text, max(width, 10), break_long_words=False,
                         break_on_hyphens=False) or [""]


def output(doc: Any, rows: Sequence[dict[str, Any]], columns: Sequence[str],
           as_json: bool) -> None:
    """`doc` as JSON, or `rows` as a table."""
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(table(rows, columns))


def progress(done: int, total: int, what: str) -> None:
    """One self-overwriting line on stderr for long operations (only on a terminal)."""
    if sys.stderr.isatty():
        end = "\n" if done >= total else ""
        print(f"\r{what}: {done}/{total}", end=end, file=sys.stderr, flush=True)


def json_argument(kind: type) -> Callable[[str], Any]:
    """An argparse `type=` that parses a JSON value of `kind` (list, dict)."""
    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value
    return parse
