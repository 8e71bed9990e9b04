"""A RabbitMQ cluster of a test's own: three nodes on loopback, each with its own node name
(`rabbit-<unique>-<n>@localhost`), AMQP, distribution and management ports, data and log
directories under one temp dir, joined with `rabbitmqctl join_cluster`.

Why its own cookie: the nodes and the `rabbitmqctl` calls that drive them share one HOME
(the temp dir), so they share the `.erlang.cookie` written there; the shared node
(rabbit@localhost, cookie in /var/lib/rabbitmq) is never told of them and never touched.
Every node is stopped at teardown by its pid and `rabbitmqctl -n <its own name> stop`, and
the temp dir is removed, so no epmd registration or data dir is left behind.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

from tests.integration.private_servers import RABBITMQ_BIN, accepts
from tests.support import free_port, wait_for

USER = PASSWORD = "guest"


@dataclass
class Node:
    """One node: its name, ports and directories, and the server process while it runs."""

    name: str
    amqp: int
    dist: int
    management: int
    home: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.amqp}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management}"


@dataclass
class Cluster:
    """The running cluster: start, kill and restart nodes; ask it about a queue."""

    root: Path
    nodes: list[Node] = field(default_factory=list)
    started_in: float = 0.0  # seconds from the first start to a formed cluster

    def env(self, node: Node) -> dict[str, str]:
        data = node.home
        return {**os.environ, "HOME": str(self.root), "RABBITMQ_NODENAME": node.name,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(node.amqp),
                "RABBITMQ_DIST_PORT": str(node.dist),
                "RABBITMQ_MNESIA_BASE": str(data / "mnesia"),
                "RABBITMQ_LOG_BASE": str(data / "log"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "plugins"),
                "RABBITMQ_CONFIG_FILE": str(data / "rabbitmq"),
                "RABBITMQ_PID_FILE": str(data / "pid")}

    def url(self, order: list[int] | None = None, vhost: str = "%2F", query: str = "") -> str:
        """A multi-host amqp:// URL naming the nodes in `order` (indexes; default all, in
        order), with the management API of each."""
        chosen = [self.nodes[i] for i in (order if order is not None else range(len(self.nodes)))]
        hosts = ",".join(n.url for n in chosen)
        management = ",".join(n.management_url for n in chosen)
        extra = f"&{query}" if query else ""
        return f"amqp://{USER}:{PASSWORD}@{hosts}/{vhost}?management={management}{extra}"

    def start(self, node: Node) -> None:
        """Start `node`'s server (`wait_up` waits for it)."""
        with open(node.home / "server.out", "ab") as out:
            node.proc = subprocess.Popen([str(RABBITMQ_BIN / "rabbitmq-server")],
                                         env=self.env(node), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_up(self, node: Node, timeout: float = 90) -> None:
        wait_for(lambda: accepts(node.amqp) and accepts(node.management), timeout,
                 f"RabbitMQ node {node.name} (log: {node.home / 'server.out'})")

    def ctl(self, node: Node, *args: str, timeout: float = 60) -> str:
        """`rabbitmqctl -n <node> ...` (never the shared node)."""
        done = subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, *args],
                              env=self.env(node), capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode:
            raise AssertionError(f"rabbitmqctl -n {node.name} {' '.join(args)} failed: "
                                 f"{done.stdout}{done.stderr}")
        return done.stdout

    def ctl_all(self, nodes: list[Node], *args: str, timeout: float = 120) -> None:
        """`rabbitmqctl -n <node> ...` on each of `nodes` at once."""
        running = [(node, subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, *args], env=self.env(node),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) for node in nodes]
        for node, proc in running:
            out, _ = proc.communicate(timeout=timeout)
            if proc.returncode:
                raise AssertionError(f"rabbitmqctl -n {node.name} {' '.join(args)} failed: "
                                     f"{out}")

    def kill(self, node: Node) -> None:
        """kill -9 the node's Erlang VM (the server script execs it: the pid is the VM's)."""
        assert node.proc is not None
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=30)
        node.proc = None

    def stop_all(self) -> None:
        """Stop every node at once: SIGTERM to each server by pid (its script has the Erlang
        VM stop gracefully); a node still up after 15 s (one booting waits for its peers'
        tables and ignores it) gets `rabbitmqctl -n <its name> stop`, then SIGKILL to its
        process group. The script may exit before its VM does (dash's trap), so what is
        awaited is the whole group. One `rabbitmqctl stop` after another took 20 s."""
        running = [n for n in self.nodes if n.proc is not None]
        for node in running:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for node in running:
            assert node.proc is not None
            pgid = node.proc.pid
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if group_alive(pgid):
                subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, "stop"],
                               env=self.env(node), capture_output=True, timeout=30,
                               check=False)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            node.proc.wait(timeout=30)
            wait_for(lambda pgid=pgid: not group_alive(pgid), 30,
                     f"the processes of RabbitMQ node {node.name} to exit")
            node.proc = None

    def api(self, path: str) -> Any:
        """GET `path` from the first management API that answers."""
        token = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        last: Exception | None = None
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                with urlopen(Request(node.management_url + path,
                                     headers={"Authorization": token}), timeout=10) as r:
                    return json.load(r)
            except OSError as exc:
                last = exc
        raise AssertionError(f"no management API answered {path}: {last}")

    def queue(self, name: str, vhost: str = "%2F") -> dict[str, Any]:
        found: dict[str, Any] = self.api(f"/api/queues/{vhost}/{name}")
        return found

    def node_named(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


EPMD = next(iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), Path("epmd"))


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` (a node's server script and VM) runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def registered(node: Node) -> bool:
    """Whether `node` is registered with epmd (its Erlang VM is up)."""
    names = subprocess.run([str(EPMD), "-names"], capture_output=True, text=True,
                           timeout=10).stdout
    return f"name {node.name.split('@')[0]} at port" in names


def cluster_available() -> bool:
    return (RABBITMQ_BIN / "rabbitmq-server").exists()


@contextmanager
def rabbit_cluster(unique: str, size: int = 3) -> Iterator[Cluster]:
    """Start a `size`-node cluster (see the module docstring); stop it all after."""
    root = Path(tempfile.mkdtemp(prefix="conveyor-rabbit-cluster-"))
    cookie = root / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(20))
    cookie.chmod(0o400)
    (root / "plugins").write_text("[rabbitmq_management].\n")
    cluster, began = Cluster(root), time.monotonic()
    for n in range(1, size + 1):
        home = root / f"node{n}"
        home.mkdir()
        node = Node(f"rabbit-{unique}-{n}@localhost", free_port(), free_port(), free_port(),
                    home)
        (home / "rabbitmq.conf").write_text(
            f"management.tcp.port = {node.management}\nmanagement.tcp.ip = 127.0.0.1\n"
            "loopback_users = none\ncollect_statistics_interval = 1000\n")
        cluster.nodes.append(node)
    try:
        for node in cluster.nodes:
            cluster.start(node)
        for node in cluster.nodes:
            cluster.wait_up(node)
        first, rest = cluster.nodes[0], cluster.nodes[1:]
        cluster.ctl_all(rest, "stop_app")
        for node in rest:
            cluster.ctl(node, "join_cluster", first.name)
        cluster.ctl_all(rest, "start_app")
        for node in rest:
            cluster.wait_up(node)
        cluster.started_in = time.monotonic() - began
        yield cluster
    finally:
        cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)
        # a node gone unregisters from epmd as its VM exits: none may be left behind
        wait_for(lambda: not any(registered(node) for node in cluster.nodes), 30,
                 "the cluster's nodes to leave epmd")


def wait_running(cluster: Cluster, count: int, timeout: float = 60) -> None:
    """Wait until the management API lists `count` running nodes."""
    def running() -> bool:
        try:
            return sum(1 for n in cluster.api("/api/nodes") if n.get("running")) >= count
        except AssertionError:
            return False
    wait_for(running, timeout, f"{count} running RabbitMQ nodes")
