"""A Postgres primary and a streaming standby of the test's own, for failover tests.

`standby_pair` makes them with the server binaries (/usr/lib/postgresql/*/bin): `initdb`, the
primary started with replication on and `synchronous_standby_names='*'` (a commit returns
once the standby has flushed it, so what a client saw committed survives the primary), then
`pg_basebackup -R` for the standby, started on a port of its own. Each on a free port, in a
directory of its own under /tmp (run as the postgres user when the test runs as root: initdb
refuses root; pytest's tmp_path is not reachable by that user).

`Pair.crash_primary()` is `kill -9` of the primary's postmaster and of its backends (a host
that died: nothing of it answers any more); `Pair.promote()` is `pg_ctl promote` of the
standby. `close()` kills every process of both clusters (found by their working directory,
which Postgres sets to its data directory) and removes the directories.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.integration.private_servers import PG_BIN
from tests.support import free_port, wait_for


@dataclass
class Pair:
    """A primary and its synchronous standby: ports, data directories, and what to run as."""

    home: Path
    ports: tuple[int, int] = field(default_factory=lambda: (free_port(), free_port()))
    as_postgres: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """libpq's multi-host URL: the primary first, then the standby."""
        return f"postgresql://postgres@127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}/postgres"

    def single(self, which: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[which]}/postgres"

    def data(self, which: int) -> Path:
        return self.home / ("primary" if which == 0 else "standby")

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_postgres, *argv], check=True, capture_output=True, timeout=120)

    def _ctl(self, which: int, *argv: str) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data(which)), "-l",
                  str(self.home / f"{self.data(which).name}.log"), *argv)

    def _start(self, which: int, *settings: str) -> None:
        options = " ".join([f"-p {self.ports[which]} -k {self.home}",
                            "-c listen_addresses=127.0.0.1 -c fsync=off",
                            *(f"-c {s}" for s in settings)])
        self._ctl(which, "-o", options, "-w", "start")

    def make(self) -> None:
        assert PG_BIN is not None
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data(0)), "-U", "postgres",
                  "--auth=trust", "-N")
        self._start(0, "wal_level=replica", "max_wal_senders=4", "hot_standby=on",
                     "synchronous_standby_names='*'")
        self._run(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.ports[0]),
                  "-U", "postgres", "-D", str(self.data(1)), "-R", "-X", "stream", "-c", "fast")
        self._start(1, "hot_standby=on")
        wait_for(self._synchronous, 60, "the standby to stream synchronously")

    def _synchronous(self) -> bool:
        with psycopg.connect(self.single(0), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication "
                               "WHERE sync_state = 'sync' AND state = 'streaming'").fetchone()
        return row is not None and row[0] == 1

    def crash_primary(self) -> float:
        """`kill -9` of the primary's postmaster, then of what it had forked; the time."""
        postmaster = int((self.data(0) / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        at = time.time()
        self._kill_all(self.data(0))
        return at

    def promote(self) -> None:
        self._ctl(1, "-w", "promote")

    def close(self) -> None:
        for which in (0, 1):
            if (self.data(which) / "postmaster.pid").exists():
                subprocess.run([*self.as_postgres, str(PG_BIN / "pg_ctl"), "-D",
                                str(self.data(which)), "-m", "immediate", "stop"],
                               capture_output=True, timeout=60)
            self._kill_all(self.data(which))
        shutil.rmtree(self.home, ignore_errors=True)

    @staticmethod
    def _kill_all(data: Path) -> None:
        """SIGKILL every process whose working directory is `data` (Postgres's are)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if Path(os.readlink(entry / "cwd")) == data:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue   # gone, or not ours to look at


def standby_pair() -> Pair:
    """A primary and a synchronous standby, made and running (the caller closes it)."""
    if PG_BIN is None:
        missing = "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) here"
        if os.environ.get("CI") == "true":   # in CI a missing server fails, never skips
            pytest.fail(missing)
        pytest.skip(missing)
    pair = Pair(Path(tempfile.mkdtemp(prefix="conveyor-pgha-")))
    if os.geteuid() == 0:
        pair.as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(pair.home, "postgres")
    try:
        pair.make()
    except BaseException:
        pair.close()
        raise
    return pair
