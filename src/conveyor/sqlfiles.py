"""Named SQL queries kept in `.sql` files, loaded once (procrastinate's way).

A file holds blocks that each start with a line `-- name: some_query`; everything up to the
next such line is that query. Keeping SQL in SQL files lets it be read, linted and diffed as
SQL, and keeps the Python around it short.
"""

from __future__ import annotations

import pkgutil
import re
from functools import cache

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def load(package: str, filename: str) -> dict[str, str]:
    """Every named query in `package/filename`, by name."""
    # pkgutil reads it through the package's loader (a directory or a zip, as
    # importlib.resources does) without importing importlib.resources and zipfile: ~0.4 MiB
    # in every process that opens a store, the worker's supervisor among them
    data = pkgutil.get_data(package, filename)
    if data is None:
        raise ValueError(f"{package}/{filename}: its package's loader cannot read files")
    text = data.decode()
    parts = _NAME.split(text)
    queries = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    if not queries:
        raise ValueError(f"{package}/{filename} holds no '-- name:' queries")
    return queries
