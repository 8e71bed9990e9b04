"""Where things are, and URLs safe to print: the data directory, a SQLite URL's file, and a
URL with its password masked.

These sit below every transport and the state store (config reads the data directory, the
store opens SQLite files, everyone logs URLs), so none of them has to import a broker to
find a path or hide a password.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from conveyor.errors import ConfigError


def data_dir() -> Path:
    """Where the embedded default keeps its files: $CONVEYOR_HOME or the XDG data dir."""
    home = os.environ.get("CONVEYOR_HOME")
    if home:
        return Path(home)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "conveyor"


def path_from_url(url: str) -> tuple[Path, dict[str, str]]:
    """`sqlite:///abs/path.db?x=y` -> (Path, options)."""
    parts = urlsplit(url)
    if not parts.path or parts.path == "/":
        raise ConfigError(f"SQLite URL {url!r} names no file: use sqlite:///path/to/file.db")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return Path(parts.path), options


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for logs and errors."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url
