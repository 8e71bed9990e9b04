"""Named SQL queries kept in `.sql` files, loaded once (procrastinate's way).

A file holds blocks that each start with a line `-- name: some_query`; everything up to the
next such line is that query. Keeping SQL in SQL files lets it be read, linted and diffed as
SQL, and keeps the Python around it short.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def load(package: str, filename: str) -> dict[str, str]:
    """Every named query in `package/filename`, by name."""
    text = resources.files(package).joinpath(filename).read_text()
    parts = _NAME.split(text)
    queries = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    if not queries:
        raise ValueError(f"{package}/{filename} holds no '-- name:' queries")
    return queries
