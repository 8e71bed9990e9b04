"""Broker servers of a test's own (never the shared ones other tests use), to stop and start
at will: Redis with `--appendonly yes` on a free port, a PostgreSQL cluster made with initdb
in a temp dir, a RabbitMQ node with its own name, ports and data dir. The fixtures are
offered to every integration test by tests/integration/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port, wait_for

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None) \
    if Path("/usr/lib/postgresql").exists() else None


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


@dataclass
class PrivateServer:
    """A broker server of this test's own: `stop()` and `start()` it at will."""

    url: str
    port: int
    start: Callable[[], None]
    stop: Callable[[], None]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateServer]:
    with redis_server(tmp_path) as server:
        yield server


@contextmanager
def redis_server(home: Path, hosts: Sequence[str] = ("127.0.0.1",)) -> Iterator[PrivateServer]:
    """A Redis of the caller's own listening on `hosts` (the first is the URL's), its files
    in `home`; stopped on leaving."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here")
    port, procs = free_port(*hosts), []
    argv = ["redis-server", "--port", str(port), "--bind", *hosts, "--dir", str(home),
            "--protected-mode", "no", "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", ""]

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        wait_for(lambda: accepts(port, hosts[0]), 20, "the private Redis")

    def stop_it() -> None:
        proc = procs.pop()
        proc.terminate()  # SIGTERM: Redis flushes its AOF and exits
        proc.wait(timeout=30)

    start()
    try:
        yield PrivateServer(f"redis://{hosts[0]}:{port}/0", port, start, stop_it)
    finally:
        while procs:
            stop_it()


@pytest.fixture
def private_postgres() -> Iterator[PrivateServer]:
    with postgres_server() as server:
        yield server


@contextmanager
def postgres_server(hosts: Sequence[str] = ("127.0.0.1",),
                    trusted: str = "") -> Iterator[PrivateServer]:
    """A PostgreSQL cluster of the caller's own (initdb in a temp dir) listening on `hosts`
    (the first is the URL's); `trusted`: a network (CIDR) whose clients it also trusts,
    besides loopback. Stopped and removed on leaving."""
    if PG_BIN is None:
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) here")
    # Its own directory under /tmp: pytest's tmp_path is not reachable by the postgres user.
    home = Path(tempfile.mkdtemp(prefix="conveyor-pg-"))
    port, data = free_port(*hosts), home / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(home, "postgres")
    ctl = [*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(home / "log")]
    options = f"-p {port} -k {home} -c listen_addresses={','.join(hosts)} -c fsync=off"

    def start() -> None:
        subprocess.run([*ctl, "-o", options, "-w", "start"], check=True, capture_output=True,
                       timeout=60)

    def stop_it() -> None:
        subprocess.run([*ctl, "-m", "fast", "-w", "stop"], check=True, capture_output=True,
                       timeout=60)

    try:
        subprocess.run([*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-U",
                        "postgres", "--auth=trust", "-N"], check=True, capture_output=True,
                       timeout=120)
        if trusted:
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {trusted} trust\n")
        start()
        yield PrivateServer(f"postgresql://postgres@{hosts[0]}:{port}/postgres", port, start,
                            stop_it)
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


@pytest.fixture
def private_rabbitmq(unique: str) -> Iterator[PrivateServer]:
    """A RabbitMQ node of this test's own: its own node name, ports, data and logs in a temp
    dir, no plugins (the shared node holds the management port); stopped and started with
    `rabbitmqctl -n <node>`, which never touches the shared node."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        pytest.skip("RabbitMQ server scripts (/usr/lib/rabbitmq/bin) are not installed here")
    home = Path(tempfile.mkdtemp(prefix="conveyor-rabbit-"))
    (home / "plugins").write_text("[].\n")
    port, node, procs = free_port(), f"conveyor-{unique}@localhost", []
    env = {**os.environ, "HOME": str(home), "RABBITMQ_NODENAME": node,
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(free_port()),
           "RABBITMQ_MNESIA_BASE": str(home / "mnesia"), "RABBITMQ_LOG_BASE": str(home / "log"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "plugins"),
           "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"), "RABBITMQ_PID_FILE": str(home / "pid")}

    def start() -> None:
        with open(home / "server.out", "a") as out:
            procs.append(subprocess.Popen([str(RABBITMQ_BIN / "rabbitmq-server")], env=env,
                                          stdout=out, stderr=subprocess.STDOUT))
        wait_for(lambda: accepts(port), 60, "the private RabbitMQ node")

    def stop_it() -> None:
        subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node, "stop"], env=env,
                       capture_output=True, timeout=60)
        procs.pop().wait(timeout=60)

    try:
        start()
        yield PrivateServer(f"amqp://guest:guest@127.0.0.1:{port}/%2F", port, start, stop_it)
    finally:
        while procs:
            stop_it()
        shutil.rmtree(home, ignore_errors=True)


def with_options(url: str, **options: object) -> str:
    return url + "?" + "&".join(f"{k}={v}" for k, v in options.items())
