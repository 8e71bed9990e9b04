"""Flow control end to end: real `conveyor worker` processes, real brokers and stores.

Each task writes start and end lines to a ledger file; what the limits promise is checked
from the ledger (never from the limiter's own counters).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker import Broker, from_url
from conveyor.client import Client
from tests.conftest import POSTGRES_URL, REDIS_URL, clean_transport, require_service
from tests.integration import flow_tasks
from tests.integration.workerkit import finish, start_worker, worker_env

APP = "tests.integration.flow_tasks"
# backend -> (service, broker URL for a test, extra settings)
SETUPS = {
    "sqlite": (None, "sqlite:///{tmp}/broker.db", {}),
    "redis": ("redis", REDIS_URL + "?prefix={name}", {}),
    "postgres": ("postgres", POSTGRES_URL + "?schema={name}", {}),
}


@pytest.fixture(params=sorted(SETUPS))
def setup(request: pytest.FixtureRequest, tmp_path: Path,
          unique: str) -> Iterator[tuple[str, dict[str, str]]]:
    service, url, extra = SETUPS[request.param]
    if service:
        require_service(service)
    yield url.format(tmp=tmp_path, name=unique), {
        k: v.format(tmp=tmp_path, name=unique) for k, v in extra.items()}
    clean_transport(request.param, unique)


def workers(url: str, queue: str, n: int, extra: dict[str, str], *flags: str,
            burst: bool = True) -> list[subprocess.Popen[str]]:
    env = worker_env(url, **extra)
    return [start_worker(url, queue, "--concurrency=1", "--max-tasks-per-child=1000",
                         f"--app={APP}", *flags, burst=burst, env=env) for _ in range(n)]


def ledger_lines(path: Path) -> list[tuple[str, float, str]]:
    out = []
    for line in path.read_text().splitlines():
        what, at, tag = line.split()
        out.append((what, float(at), tag))
    return out


def most_at_once(lines: list[tuple[str, float, str]], tag: str) -> int:
    """The largest number of `tag` tasks between their S and E lines at any instant."""
    running = peak = 0
    for what, _, _ in sorted((x for x in lines if x[2] == tag), key=lambda x: (x[1], x[0])):
        running += 1 if what == "S" else -1
        peak = max(peak, running)
    return peak


def enqueue_all(broker: Broker, messages: list) -> None:  # type: ignore[type-arg]
    client = Client(broker)
    for m in messages:
        client.enqueue(m)


def test_max_2_on_one_key_holds_across_4_workers(setup: tuple[str, dict[str, str]],
                                                 tmp_path: Path, unique: str) -> None:
    url, extra = setup
    ledger = tmp_path / "ledger"
    with from_url(url) as broker:
        enqueue_all(broker, [flow_tasks.tenant_job.message(("acme", str(ledger), 0.01),
                                                           queue=unique) for _ in range(200)])
    procs = workers(url, unique, 4, extra)
    outputs = [finish(p, timeout=120) for p in procs]
    lines = ledger_lines(ledger)
    assert sum(1 for x in lines if x[0] == "E") == 200, outputs[0][-3000:]
    assert most_at_once(lines, "acme") == 2



def test_a_rate_of_10_a_second_spaces_100_tasks_over_10_seconds(
        setup: tuple[str, dict[str, str]], tmp_path: Path, unique: str) -> None:
    url, extra = setup
    ledger = tmp_path / "ledger"
    with from_url(url) as broker:
        enqueue_all(broker, [flow_tasks.rated_job.message((str(ledger),), queue=unique)
                             for _ in range(100)])
    procs = workers(url, unique, 2, extra)
    outputs = [finish(p, timeout=120) for p in procs]
    lines = ledger_lines(ledger)
    starts = sorted(at for what, at, _ in lines if what == "S")
    ends = sorted(at for what, at, _ in lines if what == "E")
    assert len(ends) == 100, outputs[0][-3000:]
    # reservations are 0.1 s apart from the first start: 99 intervals, plus delivery jitter
    assert 9.5 <= ends[-1] - starts[0] <= 11.0, (starts[0], starts[-1], ends[-1])
