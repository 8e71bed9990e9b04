"""Where things are, and URLs safe to print: the data directory, a URL's scheme, every store's
URL (`store_urls`), a SQLite URL's file, a URL with its password masked, and the ports the
daemons listen on.

These sit below every transport and the state store (config reads the data directory, the
store opens SQLite files, everyone logs URLs), so none of them has to import a broker to
find a path or hide a password.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor.errors import ConfigError
from conveyor.pgfailover import url_names_several_hosts


def data_dir() -> Path:
    """Where the embedded default keeps its files: $CONVEYOR_HOME or the XDG data dir."""
    home = os.environ.get("CONVEYOR_HOME")
    if home:
        return Path(home)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "conveyor"


#: The file in the data directory naming the DAGs folder `conveyor up` runs with it.
UP_DAGS_FOLDER = "up-dags-folder"
#: The DAGs folder of every command that reads one, unless told otherwise.
DAGS = "dags"


def dags_folder(configured: str = DAGS) -> str:
    """The DAGs folder a command uses: the one it was given; for the default, ./dags when
    there is one, else the folder `conveyor up` runs with this data directory (it writes it
    there at start), so `conveyor dags list` typed beside a running `up` sees its DAGs; else
    ./dags, whose absence the loader then reports."""
    if configured != DAGS or Path(DAGS).is_dir():
        return configured
    try:
        recorded = (data_dir() / UP_DAGS_FOLDER).read_text().strip()
    except OSError:
        return configured
    return recorded if recorded and Path(recorded).is_dir() else configured


def scheme(url: str) -> str:
    """The URL's scheme, lower-cased ("" when it has none): what chooses a transport or a
    store (`kombu+redis`, `postgresql`, `sqlite` …)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


REDIS = ("redis", "rediss", "redis+sentinel")
POSTGRES = ("postgresql", "postgres")


def embedded_broker_url() -> str:
    """The embedded default broker: SQLite in the per-user data directory."""
    return f"sqlite:///{data_dir() / 'conveyor.db'}"


def embedded_state_url() -> str:
    """The embedded default state store: SQLite beside the default broker's file."""
    return f"sqlite:///{data_dir() / 'scheduler.db'}"


@dataclass(frozen=True)
class StoreURLs:
    """Where each store is, from one broker URL and the URLs given for the others."""

    #: the broker (the embedded default spelled out)
    broker: str
    #: the scheduler's state store (the embedded default spelled out)
    state: str
    #: task results: Redis beside the queues, SQLite's results.db beside the broker's file,
    #: the Postgres broker's database; else the state store
    results: str
    #: flow control: the broker when it is Redis, Postgres or SQLite, else the state store
    limits: str
    #: where a daemon records itself for `conveyor status` and the dashboard (a worker's
    #: heartbeat, the autoscaler's decisions); None for a daemon given only a broker URL:
    #: its state store would be a file no one else reads
    registry: str | None


def store_urls(broker_url: str = "", state_url: str = "", result_url: str = "",
               limits_url: str = "") -> StoreURLs:
    """Every store's URL: the one given, else derived from the broker URL (the one place
    that derivation is written; README: where results and limits are kept)."""
    broker = broker_url or embedded_broker_url()
    state = state_url or embedded_state_url()
    return StoreURLs(broker=broker, state=state,
                     results=result_url or _results_beside(broker, state),
                     limits=limits_url or _limits_beside(broker, state),
                     registry=state_url or (None if broker_url else state))


#: A Postgres broker URL's options that are the broker's (broker/pgurl.py), not libpq's: a
#: store opened on the same URL drops them (`retry_seconds` kept there failed every result
#: write of a worker whose broker URL set it: libpq refuses an option it does not know).
POSTGRES_BROKER_OPTIONS = ("ack_commit", "vacuum_every", "retry_seconds", "reconnect_timeout")


def _results_beside(broker: str, state: str) -> str:
    kind = scheme(broker)
    if kind in REDIS:
        return broker
    if kind == "sqlite":   # results.db beside the broker's file, its options dropped
        return f"sqlite://{path_from_url(broker)[0].parent / 'results.db'}"
    if kind in POSTGRES:   # the broker's own options dropped: libpq refuses them
        return _without(broker, *POSTGRES_BROKER_OPTIONS)
    return state


def _limits_beside(broker: str, state: str) -> str:
    kind = scheme(broker)
    if kind in POSTGRES:   # its commits asynchronous when the broker's acks are
        if "ack_commit=sync" in broker or (url_names_several_hosts(broker)
                                           and "ack_commit=async" not in broker):
            return broker   # (several hosts: a failover shape, synchronous by default)
        return broker + ("&" if "?" in broker else "?") + "commit=async"
    return broker if kind in (*REDIS, "sqlite") else state


def _without(url: str, *options: str) -> str:
    """`url` without these query options."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if k not in options]
    return urlunsplit(parts._replace(query=urlencode(kept)))


def path_from_url(url: str) -> tuple[Path, dict[str, str]]:
    """`sqlite:///abs/path.db?x=y` -> (Path, options)."""
    parts = urlsplit(url)
    if not parts.path or parts.path == "/":
        raise ConfigError(f"SQLite URL {url!r} names no file: use sqlite:///path/to/file.db")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return Path(parts.path), options


def missing_sqlite_file(url: str) -> Path | None:
    """The file a `sqlite:///` URL names, when it does not exist yet; None otherwise (it
    exists, or the URL is not SQLite). Reading commands check this first: opening the file
    would create it, and reading must not create state."""
    if scheme(url) != "sqlite":
        return None
    path = path_from_url(url)[0]
    if path.is_absolute():
        path = Path("/", *path.parts[1:])   # sqlite:////abs/file.db reads as //abs/file.db
    return None if path.exists() else path


_QUERY_PASSWORD = re.compile(r"(?<=[?&])((?:sentinel_)?password)=[^&#]*")


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for logs and errors: the one before the
    host, and a query's ?password= or ?sentinel_password= (redis+sentinel://)."""
    url = _QUERY_PASSWORD.sub(r"\1=***", url)
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


@contextmanager
def listening(what: str, host: str, port: int, flag: str) -> Iterator[None]:
    """Bind `what`'s server inside: a port in use or an address not of this machine is one
    line naming the address and the flag to change (a ConfigError: the command needs fixing),
    the same for every daemon (worker, scheduler and autoscaler metrics, the dashboard)."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"cannot serve {what} on {host}:{port} "
                          f"({exc.strerror or exc}): pass {flag} with a free port") from None
