"""Output for people (aligned tables) or scripts (`--json`), and JSON arguments.

Every command prints through these, so a table looks the same everywhere and `--json`
always means one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns under upper-case headers."""
    cells = [[c.upper() for c in columns]] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


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
