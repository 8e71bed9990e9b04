"""A Redis Sentinel deployment of a test's own: a primary, a replica and three Sentinels on
free loopback ports, each with its own directory under the test's tmp dir, started once per
module (`deployment`, the body of each module's fixture) and killed at teardown (every pid
it started, nothing else).

`kill_primary()` is a `kill -9` of whichever node is the primary now; `revive()` starts the
killed node again on its port as a replica of the promoted one and waits until it is in sync
and the Sentinels see it, so the next test meets a primary with a replica again. Sentinel's
down-after-milliseconds is 1000 so a failover takes a few seconds, not the default 30+.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.integration.private_servers import accepts
from tests.support import free_port, wait_for

MASTER = "mymaster"
DOWN_AFTER_MS = 1000


@dataclass
class Node:
    """One redis-server of the deployment: its port, directory and running process."""

    name: str
    port: int
    home: Path
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.home / "out.log", "ab")   # noqa: SIM115  (closed with the process)
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.home)
        log.close()
        wait_for(lambda: accepts(self.port), 20, f"{self.name} on port {self.port}",
                 detail=self.log_tail)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                           socket_connect_timeout=2)

    def log_tail(self) -> str:
        path = self.home / "out.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@dataclass
class SentinelCluster:
    """The deployment: `url` is the redis+sentinel:// address of its master."""

    home: Path
    data: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)
    killed: Node | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    def master_port(self) -> int:
        """The primary's port as the Sentinels say it."""
        with self.sentinels[0].client() as s:
            _, port = s.sentinel_get_master_addr_by_name(MASTER)
        return int(port)

    def primary(self) -> Node:
        port = self.master_port()
        return next(n for n in self.data if n.port == port)

    def kill_primary(self) -> Node:
        """kill -9 of the primary now; the node killed."""
        node = self.killed = self.primary()
        node.kill()
        return node

    def promoted(self, timeout: float = 30) -> Node:
        """The node the Sentinels promoted after `kill_primary`, once they have."""
        assert self.killed is not None
        killed = self.killed.port
        wait_for(lambda: self.master_port() != killed, timeout,
                 "the Sentinels to promote the replica", ignore=(redis.RedisError,),
                 detail=self.sentinels[0].log_tail)
        return self.primary()

    def revive(self, timeout: float = 60) -> None:
        """Start the killed node again (empty) and wait until it is a replica in sync."""
        node = self.killed
        if node is None:
            return
        primary = self.promoted()
        self.killed = None
        # as its replica straight away, as an operator restarting a failed node would: left
        # to find out, the Sentinels take ~16 s to demote a node that comes back as master
        argv = node.argv
        if "--replicaof" in argv:
            argv = argv[:argv.index("--replicaof")]
        node.argv = [*argv, "--replicaof", "127.0.0.1", str(primary.port)]
        node.start()
        self.healthy(timeout)

    def healthy(self, timeout: float = 60) -> None:
        """A primary with every other data node a replica in sync, seen by all Sentinels."""
        def ready() -> bool:
            primary = self.primary()
            for node in self.data:
                if node is primary:
                    continue
                with node.client() as c:
                    info = c.info("replication")
                if info.get("master_port") != primary.port or \
                        info.get("master_link_status") != "up":
                    return False
            for s in self.sentinels:
                with s.client() as c:
                    state = c.sentinel_master(MASTER)
                    if state.get("num-slaves", 0) < len(self.data) - 1 or \
                            state.get("num-other-sentinels", 0) < len(self.sentinels) - 1:
                        return False
            return True
        wait_for(ready, timeout, "the Sentinel deployment to be whole (replica in sync, "
                 "Sentinels seeing each other)", ignore=(redis.RedisError, StopIteration),
                 detail=lambda: "\n".join(n.log_tail() for n in self.sentinels[:1]))

    def stop(self) -> None:
        for node in [*self.sentinels, *self.data]:
            node.kill()


def start_cluster(home: Path) -> SentinelCluster:
    """A primary, a replica and three Sentinels under `home`, whole when it returns."""
    cluster = SentinelCluster(home)
    primary_port = free_port()
    for name, replica_of in (("primary", None), ("replica", primary_port)):
        port = primary_port if replica_of is None else free_port()
        where = home / name
        where.mkdir()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir",
                str(where), "--save", "", "--appendonly", "no"]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        cluster.data.append(Node(name, port, where, argv))
    for i in range(3):
        port, where = free_port(), home / f"sentinel{i}"
        where.mkdir()
        (where / "sentinel.conf").write_text(
            f"port {port}\nbind 127.0.0.1\ndir {where}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} 10000\n"
            f"sentinel parallel-syncs {MASTER} 1\n")
        cluster.sentinels.append(Node(f"sentinel{i}", port, where, [
            "redis-server", str(where / "sentinel.conf"), "--sentinel"]))
    try:
        for node in [*cluster.data, *cluster.sentinels]:
            node.start()
        cluster.healthy()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    """The body of a module's fixture: one deployment for the module, killed after it."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here")
    cluster = start_cluster(tmp_path_factory.mktemp("sentinel"))
    try:
        yield cluster
    finally:
        cluster.stop()

