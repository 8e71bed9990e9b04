"""Worker "hosts" in network namespaces of their own, on links a test cuts, heals and slows.

Why: a partition is not a dead process. A worker cut off from its broker goes on running its
task while its lease lapses and another worker runs it again; what it sends when the link
heals (a late ack, result, event) must be refused. Only a real network between real
processes shows that, so each "host" is a network namespace (`ip netns`) joined to the root
namespace by a veth pair, and the test's own broker servers listen on an address private to
the test (`Network.server`, on `lo` in the root namespace), reached from every host through
its link. A host's processes run under `ip netns exec`; files (a task's ledger) are shared.

* `cut()`: nftables in the host's namespace drops every packet in and out but loopback: a
  silent partition (connections stay open, nothing arrives), as a pulled cable or a switch
  failure looks to TCP; `cut(port)` drops only its connections to that port (one service
  cut off, the others reachable). `heal()` removes the rule; open connections carry on.
* `slow()`: `netem delay 100ms loss 5%` on both ends of the link (200 ms more a round trip)
  where the kernel has netem. This machine's kernel does not (CONFIG_NET_SCH_NETEM unset):
  then nftables drops 5% of packets at random both ways (TCP retransmits them, as on a lossy
  link) and a `DelayRelay` the host's processes connect through holds every chunk 100 ms each
  way. `Host.slowed_by` says which.

Addresses: a random 10.X.Y.0/24 that no address or route on the machine touches; the
server's is .1 (on `lo`), host k's link is the /30 at 4k. Names: namespaces `cv-<token>-<k>`,
veths `cv<token><k>h`/`n`, the server address labelled `lo:cv<token>`; `<token>` is also a
file under /run/conveyor-netns holding the creating pid. `close()` removes everything, and
`sweep()` (at the start of each Network) removes what a killed test run left: the names of
tokens whose pid no longer lives, never another live run's.

Needs root, `ip` and `nft` (the nftables package): `missing()` says what is absent.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import random
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import free_port

REGISTRY = Path("/run/conveyor-netns")
#: The slow link: what netem would add, and the fallback without netem.
DELAY, LOSS = 0.1, 5


def missing() -> str:
    """Why partition tests cannot run here ('' when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install {package})"
    return ""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def nft(namespace: str, script: str) -> None:
    """Run an nftables script inside `namespace`."""
    done = subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=script,
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"nft in {namespace} exited {done.returncode}: "
                           f"{done.stderr.strip()}\n{script}")


def _drop_rules(table: str, verdict: str) -> str:
    """A table whose input and output chains apply `verdict` to all but loopback."""
    return (f"table inet {table} {{\n"
            f"  chain input {{ type filter hook input priority 0; iif lo accept; {verdict}; }}\n"
            f"  chain output {{ type filter hook output priority 0; oif lo accept; {verdict}; }}\n"
            "}\n")


@dataclass
class Host:
    """One worker "host": a namespace and its link to the root namespace."""

    namespace: str
    veth: str          # the link's end in the root namespace
    inner: str         # its end in the namespace
    address: str       # the host's own address
    slowed_by: str = ""

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` to run inside this host (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def cut(self, port: int = 0) -> None:
        """Drop everything to and from this host; with `port`, only its TCP connections to
        that port of any server (one service cut off, the others reachable)."""
        if not port:
            nft(self.namespace, _drop_rules("cvcut", "drop"))
            return
        nft(self.namespace, f"table inet cvcut {{\n"
                            f"  chain input {{ type filter hook input priority 0; "
                            f"tcp sport {port} drop; }}\n"
                            f"  chain output {{ type filter hook output priority 0; "
                            f"tcp dport {port} drop; }}\n}}\n")

    def heal(self) -> None:
        sh("ip", "netns", "exec", self.namespace, "nft", "delete", "table", "inet", "cvcut")

    def slow(self) -> float:
        """Make the link lossy and add DELAY each way: netem on both ends where the kernel
        has it (returns 0.0), else nftables drops LOSS% of packets at random each way and the
        caller's `DelayRelay` must add the delay (returns DELAY). `slowed_by` says which."""
        netem = ["netem", "delay", f"{DELAY * 1000:g}ms", "loss", f"{LOSS}%"]
        if sh("tc", "qdisc", "add", "dev", self.veth, "root", *netem, check=False).returncode == 0:
            sh("ip", "netns", "exec", self.namespace, "tc", "qdisc", "add", "dev", self.inner,
               "root", *netem)
            self.slowed_by = f"netem delay {DELAY * 1000:g} ms loss {LOSS}% each way"
            return 0.0
        nft(self.namespace, _drop_rules("cvloss", f"numgen random mod 100 < {LOSS} drop"))
        self.slowed_by = (f"{LOSS}% of packets dropped at random each way (nftables) and "
                          f"{DELAY * 1000:g} ms each way added by a relay (no netem in this "
                          "kernel)")
        return DELAY

    def unslow(self) -> None:
        sh("tc", "qdisc", "del", "dev", self.veth, "root", check=False)
        sh("ip", "netns", "exec", self.namespace, "tc", "qdisc", "del", "dev", self.inner, "root",
           check=False)
        sh("ip", "netns", "exec", self.namespace, "nft", "delete", "table", "inet", "cvloss",
           check=False)
        self.slowed_by = ""


class DelayRelay:
    """A TCP relay on `host` to `upstream` that holds every chunk `delay` seconds each way
    before passing it on (pipelined: a chunk's wait does not add to the next one's). The
    slow link's delay where the kernel has no netem. Closed with `close()`."""

    def __init__(self, host: str, upstream: tuple[str, int]) -> None:
        self.delay = 0.0
        self.upstream = upstream
        self.listener = socket.create_server((host, free_port(host)))
        self.address = f"{host}:{self.listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
                threading.Thread(target=self._read, args=(source, chunks), daemon=True).start()
                threading.Thread(target=self._write, args=(sink, chunks), daemon=True).start()

    def _read(self, source: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]]
              ) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                chunks.put((time.monotonic() + self.delay, data))
        chunks.put((0.0, b""))

    def _write(self, sink: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]]
               ) -> None:
        while True:
            due, data = chunks.get()
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                sink.sendall(data)
            except OSError:
                return


@dataclass
class Network:
    """The test's private addresses: the servers' (`server`) and its hosts' links."""

    token: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list[Host] = field(default_factory=list)
    subnet: ipaddress.IPv4Network = field(init=False)

    def __post_init__(self) -> None:
        sweep()
        REGISTRY.mkdir(exist_ok=True)
        (REGISTRY / self.token).write_text(str(os.getpid()))
        self.subnet = _free_subnet()
        sh("ip", "addr", "add", f"{self.server}/32", "dev", "lo", "label", f"lo:cv{self.token}")

    @property
    def server(self) -> str:
        """The address the test's servers listen on (besides 127.0.0.1)."""
        return str(self.subnet.network_address + 1)

    def host(self) -> Host:
        k = len(self.hosts) + 1
        base = self.subnet.network_address + 4 * k
        made = Host(f"cv-{self.token}-{k}", f"cv{self.token}{k}h", f"cv{self.token}{k}n",
                    str(base + 2))
        self.hosts.append(made)
        sh("ip", "netns", "add", made.namespace)
        sh("ip", "link", "add", made.veth, "type", "veth", "peer", "name", made.inner)
        sh("ip", "link", "set", made.inner, "netns", made.namespace)
        sh("ip", "addr", "add", f"{base + 1}/30", "dev", made.veth)
        sh("ip", "link", "set", made.veth, "up")
        inside = ["ip", "-n", made.namespace]
        sh(*inside, "addr", "add", f"{made.address}/30", "dev", made.inner)
        sh(*inside, "link", "set", made.inner, "up")
        sh(*inside, "link", "set", "lo", "up")
        sh(*inside, "route", "add", f"{self.server}/32", "via", str(base + 1))
        return made

    def close(self) -> None:
        _remove(self.token)


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.X.Y.0/24 no address or route of the machine overlaps."""
    used = []
    for line in (sh("ip", "-4", "-o", "addr").stdout + sh("ip", "-4", "route", "show", "table",
                                                            "all").stdout).splitlines():
        for word in line.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    for _ in range(200):
        subnet = ipaddress.ip_network(f"10.{random.randrange(64, 250)}."
                                      f"{random.randrange(1, 250)}.0/24")
        if not any(subnet.overlaps(u) for u in used if u.prefixlen > 0):
            return subnet
    raise RuntimeError("no free 10.X.Y.0/24 after 200 tries: see `ip -4 addr` and `ip route`")


def _remove(token: str) -> None:
    """Everything made under `token`: its namespaces (their veths go with them), its server
    address, its registry entry. Each step is tried whatever the one before did."""
    for namespace in sh("ip", "netns", "list", check=False).stdout.split("\n"):
        name = namespace.split(" ")[0]
        if name.startswith(f"cv-{token}-"):
            sh("ip", "netns", "delete", name, check=False)
    for line in sh("ip", "-4", "-o", "addr", "show", "dev", "lo", check=False).stdout.splitlines():
        words = line.replace("\\", " ").split()
        if f"lo:cv{token}" in words and "inet" in words:
            sh("ip", "addr", "del", words[words.index("inet") + 1], "dev", "lo", check=False)
    (REGISTRY / token).unlink(missing_ok=True)


def sweep() -> None:
    """Remove what test runs that no longer live left behind (by their token's pid)."""
    if not REGISTRY.exists():
        return
    for entry in REGISTRY.iterdir():
        try:
            pid = int(entry.read_text() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid <= 0 or not Path(f"/proc/{pid}").exists():
            print(f"netns: removing what test run {pid} left: cv-{entry.name}-*",
                  file=sys.stderr)
            _remove(entry.name)
