"""The operator's commands as people run them, against every real broker: `dead-letters
list|show|requeue|purge`, `status`, `runs list`, `tasks show`, and a wrong config value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import cli
from conveyor.broker import Broker, from_url
from conveyor.client import Client
from conveyor.message import Codec, Message
from conveyor.scheduler.examples.revenue import build
from conveyor.scheduler.runs import trigger
from conveyor.state import store as stores
from tests.conftest import POSTGRES_URL, RABBITMQ_URL, REDIS_URL, clean_transport, require_service
from tests.integration.workerkit import finish, start_worker, task_message, worker_env

URLS = {"sqlite": (None, "sqlite:///{tmp}/broker.db"),
        "redis": ("redis", REDIS_URL + "?prefix={name}"),
        "postgres": ("postgres", POSTGRES_URL + "?schema={name}"),
        "rabbitmq": ("rabbitmq", RABBITMQ_URL)}


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("CONVEYOR_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CONVEYOR_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(params=list(URLS))
def broker_url(request: pytest.FixtureRequest, clean_env: Path, unique: str) -> Iterator[str]:
    service, template = URLS[request.param]
    if service:
        require_service(service)
    yield template.format(tmp=clean_env, name=unique)
    clean_transport(request.param, unique)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def dead_letter(url: str, queue: str, tasks: list[str], reason: str) -> None:
    """Publish messages and dead-letter them through a consumer of its own, closed after."""
    with from_url(url) as broker:
        _dead_letter(broker, queue, tasks, reason)


def _dead_letter(broker: Broker, queue: str, tasks: list[str], reason: str) -> None:
    codec = Codec()
    for task in tasks:
        broker.publish(queue, codec.encode(Message(queue=queue, task=task)))
    held = []
    for delivery in broker.consume([queue], prefetch=len(tasks), timeout=2.0):
        assert delivery is not None, "published messages did not come back"
        held.append(delivery)
        if len(held) == len(tasks):
            break
    for delivery in held:
        broker.dead_letter(delivery, reason)


def test_dead_letters_list_show_requeue_purge(capsys: pytest.CaptureFixture[str],
                                              broker_url: str, clean_env: Path,
                                              unique: str) -> None:
    queue = f"q-{unique}"
    flags = ["-Q", queue, "--broker", broker_url, "--state", f"sqlite:///{clean_env}/s.db"]
    dead_letter(broker_url, queue, ["app.a", "app.b"], "unknown task: no --app registers it")
    dead_letter(broker_url, queue, ["app.c"], "oom_killed: exceeded 64 MiB")
    with from_url(broker_url) as broker:
        try:
            code, out, _ = run(capsys, "dead-letters", "list", "--json", *flags)
            rows = json.loads(out)["dead_letters"]
            assert code == 0 and sorted(r["task"] for r in rows) == ["app.a", "app.b", "app.c"]
            oom = next(r for r in rows if r["task"] == "app.c")
            code, out, _ = run(capsys, "dead-letters", "show", oom["id"], *flags)
            assert code == 0 and "oom_killed" in out and '"task": "app.c"' in out

            code, _, err = run(capsys, "dead-letters", "requeue", *flags)
            assert code == 2 and "--id ID, --reason TEXT or --all" in err
            code, out, _ = run(capsys, "dead-letters", "requeue", "--reason", "UNKNOWN TASK",
                               "--json", *flags)
            assert code == 0 and json.loads(out)["requeued"] == 2
            depth = broker.depth(queue)
            assert (depth.ready, depth.dead) == (2, 1)

            code, out, err = run(capsys, "dead-letters", "purge", "--id", oom["id"], *flags)
            if code == 2 and "cannot delete single dead letters" in err:
                pytest.skip(err.strip())
            assert code == 0 and out.startswith("deleted 1 ")
            assert broker.depth(queue).dead == 0

            code, out, _ = run(capsys, "status", "--json", *flags)
            [shown] = [q for q in json.loads(out)["queues"] if q["queue"] == queue]
            assert shown == {"queue": queue, "ready": 2, "in_flight": 0, "delayed": 0, "dead": 0}
        finally:
            broker.purge(queue)


def test_runs_list_and_tasks_show(capsys: pytest.CaptureFixture[str], clean_env: Path) -> None:
    state = f"sqlite:///{clean_env}/state.db"
    store = stores.from_url(state)
    try:
        first = trigger(store, build(), 1000.0, executors=["queue"], logical_date=1.0)
        second = trigger(store, build(), 2000.0, executors=["queue"], logical_date=2.0)
    finally:
        store.close()
    code, out, _ = run(capsys, "runs", "list", "--state", state, "--json")
    assert code == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == [second, first]
    code, out, _ = run(capsys, "runs", "list", "--state", state, "--run-state", "success")
    assert code == 0 and first not in out
    code, out, _ = run(capsys, "tasks", "show", first, "extract_payments", "--state", state)
    assert code == 0 and "task extract_payments of run" in out and "attempt 0 of 3" in out
    code, _, err = run(capsys, "tasks", "show", first, "nope", "--state", state)
    assert code == 2 and f"conveyor runs show {first}" in err


def test_status_shows_registered_workers_and_forgets_stopped_ones(tmp_path: Path) -> None:
    broker, state = f"sqlite:///{tmp_path}/broker.db", f"sqlite:///{tmp_path}/state.db"
    env = worker_env(broker, CONVEYOR_STATE_URL=state)
    worker = start_worker(broker, "alpha,beta", "--concurrency=3", burst=False, env=env)
    status = [sys.executable, "-m", "conveyor.cli", "status", "--json"]
    try:
        deadline = time.monotonic() + 30
        workers: list[dict[str, object]] = []
        while not workers and time.monotonic() < deadline:
            time.sleep(0.2)
            done = subprocess.run(status, env=env, capture_output=True, text=True, check=True)
            workers = json.loads(done.stdout)["workers"]
        assert workers, "the worker never registered"
        [w] = workers
        assert (w["queues"], w["busy"], w["free"], w["stale"]) == ("alpha,beta", 0, 3, False)
        names = [q["queue"] for q in json.loads(done.stdout)["queues"]]
        assert {"alpha", "beta"} <= set(names)
    finally:
        worker.terminate()
        worker.communicate(timeout=60)
    after = subprocess.run(status, env=env, capture_output=True, text=True, check=True)
    assert json.loads(after.stdout)["workers"] == []


def test_a_wrong_config_value_stops_a_daemon_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "conveyor.toml").write_text("drain_timeout = \"soon\"\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "worker"], cwd=tmp_path,
                          env={**env, "CONVEYOR_HOME": str(tmp_path)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("conveyor: conveyor.toml: drain_timeout='soon' is not allowed: "
                           "must be a number\n")


def test_json_logs_carry_the_task_ids_on_every_task_line(tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    with from_url(url) as broker:
        sent = Client(broker).enqueue(task_message("t.add", unique, 2, 3))
    out = finish(start_worker(url, unique, "--log-format=json"))
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert docs and all(set(d) >= {"at", "level", "logger", "message"} for d in docs)
    [done] = [d for d in docs if "succeeded" in d["message"]]
    assert (done["task"], done["message_id"], done["attempt"]) == ("t.add", sent.id, 1)
