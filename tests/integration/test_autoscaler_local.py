"""The local target end to end on the embedded default: `conveyor autoscaler` as a process.

200 tasks wait with no worker running; the autoscaler starts workers, they drain the
queue, and after the cooldown it is back at zero, with every task run once and none
killed mid-run (scale-down drains: SIGTERM, finish, exit).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.autoscaler.targets.local import LocalWorkers
from conveyor.broker import Broker, Depth, from_url
from conveyor.client import Client
from conveyor.message import Message
from conveyor.state import store as stores
from tests.integration.workerkit import APP, ROOT, worker_env
from tests.support import free_port, wait_for

pytestmark = pytest.mark.slow
TASKS = 200


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def tail(log: Path) -> Callable[[], str]:
    """The end of the autoscaler's log, for a failure message."""
    return lambda: "autoscaler log:\n" + log.read_text()[-6000:]


def gauge(port: int, name: str, target: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    match = re.search(rf'^{name}{{target="{target}"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else None


@pytest.fixture
def autoscaler(tmp_path: Path) -> Iterator[Callable[[dict[str, object]], subprocess.Popen[bytes]]]:
    """Start `conveyor autoscaler` on a config; killed by pid (with its workers) if the
    test did not stop it."""
    started: list[subprocess.Popen[bytes]] = []

    def start(config: dict[str, object]) -> subprocess.Popen[bytes]:
        path = tmp_path / "autoscaler.toml"
        path.write_text(toml(config))
        log = open(tmp_path / "autoscaler.log", "wb")  # noqa: SIM115 (closed below)
        env = worker_env(str(config["broker_url"]), CONVEYOR_LOG_LEVEL="INFO")
        proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", "autoscaler",
                                 f"--config={path}"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            for child in children(proc.pid):
                os.kill(child, signal.SIGKILL)
            proc.kill()
        proc.wait(timeout=30)


def toml(config: dict[str, object]) -> str:
    """Just enough TOML for these configs: top-level values and [targets.<name>] tables."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in config.items() if k != "targets"]
    for name, target in config.get("targets", {}).items():  # type: ignore[attr-defined]
        lines.append(f"[targets.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in target.items()]
    return "\n".join(lines) + "\n"


def test_scales_from_zero_drains_and_returns_to_zero(
        tmp_path: Path, unique: str,
        autoscaler: Callable[[dict[str, object]], subprocess.Popen[bytes]]) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    record = tmp_path / "record"
    broker: Broker = from_url(url)
    client = Client(broker)
    for i in range(TASKS):
        client.enqueue(Message(queue=unique, task="t.record", args=(str(record), f"k{i}", 0.1)))
    port = free_port()
    state_url = f"sqlite:///{tmp_path}/state.db"
    proc = autoscaler({
        "broker_url": url, "state_url": state_url, "metrics_port": port,
        "metrics_addr": "127.0.0.1",
        "targets": {"local": {
            "kind": "local", "queues": [unique], "slots_per_replica": 4, "max_replicas": 3,
            "polling_interval": 0.2, "cooldown": 1.5, "stabilization_window": 0.5,
            "drain_timeout": 30,
            "worker_args": [f"--app={APP}", "--heartbeat-interval=1"]}}})
    log = tmp_path / "autoscaler.log"

    def done() -> int:
        return record.read_text().count("done ") if record.exists() else 0

    wait_for(lambda: done() >= TASKS, 90, f"{TASKS} tasks done", detail=tail(log))
    wait_for(lambda: gauge(port, "conveyor_autoscaler_replicas", "local") == 0.0
             and not children(proc.pid), 30, "back to zero, every worker exited",
             detail=tail(log))
    assert broker.depth(unique) == Depth(0, 0, 0, 0)
    broker.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]

    lines = record.read_text().split()
    starts = Counter(lines[i + 1] for i, word in enumerate(lines) if word == "start")
    dones = Counter(lines[i + 1] for i, word in enumerate(lines) if word == "done")
    assert starts == dones == Counter({f"k{i}": 1 for i in range(TASKS)}), "each task once"
    out = log.read_text()
    assert "0 -> 1 replicas: activated" in out
    assert re.search(r"1 -> [23] replicas", out), "sized up after activation"
    assert re.search(r"\d -> 0 replicas: nothing ready or in flight for the cooldown", out)
    for bad in ("interrupted", "cold shutdown", "killing", "exited on its own"):
        assert bad not in out, f"{bad!r} in the log:\n{out[-4000:]}"
    assert 2 <= out.count("started worker") <= 6
    recorded_decisions(state_url)


def recorded_decisions(state_url: str) -> None:
    """The journal kept what the log says, for the dashboard: each change with its reason,
    and the target's last evaluation."""
    store = stores.from_url(state_url)
    try:
        changes = [(r["from_replicas"], r["to_replicas"], r["reason"])
                   for r in reversed(store.rows("recent_scalings", limit=50))]
        [target] = store.rows("scalers")
    finally:
        store.close()
    assert changes[0][:2] == (0, 1) and changes[0][2].startswith("activated")
    assert any(before == 1 and after in (2, 3) for before, after, _ in changes)
    assert changes[-1][1] == 0 and "cooldown" in changes[-1][2]
    assert (target["target"], target["kind"], target["replicas"], target["desired"]) == (
        "local", "local", 0, 0)
    assert target["error"] is None and target["max_replicas"] == 3


def test_scale_down_stops_the_idle_worker_and_drains_the_busy_one(tmp_path: Path,
                                                                    unique: str) -> None:
    """Scenario 6 on this machine: 2 -> 1 stops the idle worker, not the one running a
    task; then 1 -> 0 stops the busy one, which finishes its task before it exits."""
    url = f"sqlite:///{tmp_path}/broker.db"
    record = tmp_path / "record"
    broker = from_url(url)
    env = worker_env(url)
    workers = LocalWorkers("t", [unique], slots=1, drain_timeout=30, env=env,
                           worker_args=[f"--app={APP}", "--heartbeat-interval=1"])
    try:
        workers.scale(2, 0)
        Client(broker).enqueue(Message(queue=unique, task="t.record",
                                       args=(str(record), "long", 2.0)))
        log = tmp_path / "none"
        log.write_text("")
        wait_for(lambda: record.exists() and "start long" in record.read_text(), 30,
                 "the long task started", detail=tail(log))
        busy = int(record.read_text().split()[2])  # the runner's pid
        [holder] = [w for w in workers._live if busy in descendants(w.proc.pid)]
        workers.scale(1, 2)
        assert workers._live == [holder], "the idle worker goes first"
        workers.scale(0, 1)
        assert workers.replicas() == 0
        assert "done long" not in record.read_text(), "still running when told to stop"
        workers.close()  # waits for the drain
        assert "done long" in record.read_text(), "the busy worker finished its task"
        assert holder.proc.returncode == 0
    finally:
        for pid in workers.pids():
            os.kill(pid, signal.SIGKILL)
        broker.close()


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        kids = children(todo.pop())
        found.update(kids)
        todo += kids
    return found
