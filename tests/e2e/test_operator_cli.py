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
from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.message import Codec, Message
from conveyor.scheduler.examples.revenue import build
from conveyor.scheduler.runs import trigger
from conveyor.state import store as stores
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    clean_transport,
    delete_redis_prefix,
    require_service,
)
from tests.integration.workerkit import finish, start_worker, task_message, worker_env
from tests.support import wait_for

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
    """Publish messages of these tasks and dead-letter them (see dead_letter_bodies)."""
    codec = Codec()
    dead_letter_bodies(url, queue, [codec.encode(Message(queue=queue, task=task))
                                    for task in tasks], reason)


def dead_letter_bodies(url: str, queue: str, bodies: list[bytes], reason: str) -> None:
    """Publish raw bodies (binary, huge: what a foreign producer sends too) and dead-letter
    them through a consumer of its own, closed after."""
    with from_url(url) as broker:
        for body in bodies:
            broker.publish(queue, body)
        held = []
        for delivery in broker.consume([queue], prefetch=len(bodies), timeout=2.0):
            assert delivery is not None, "published messages did not come back"
            held.append(delivery)
            if len(held) == len(bodies):
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
                           "must be a number of seconds, 0 or more\n")


def test_json_logs_carry_the_task_ids_on_every_task_line(tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    with from_url(url) as broker:
        sent = Client(broker).enqueue(task_message("t.add", unique, 2, 3))
    out = finish(start_worker(url, unique, "--log-format=json"))
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert docs and all(set(d) >= {"at", "level", "logger", "message"} for d in docs)
    [done] = [d for d in docs if "succeeded" in d["message"]]
    assert (done["task"], done["message_id"], done["attempt"]) == ("t.add", sent.id, 1)



def cli_bytes(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """The real command in a process of its own, its stdout as bytes (for --raw)."""
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
                          timeout=60)


def test_show_finds_a_dead_letter_by_the_message_id_enqueue_printed(
        capsys: pytest.CaptureFixture[str], broker_url: str, clean_env: Path,
        unique: str) -> None:
    queue = f"q-{unique}"
    flags = ["-Q", queue, "--broker", broker_url, "--state", f"sqlite:///{clean_env}/s.db"]
    code, out, _ = run(capsys, "enqueue", "billing.nowhere", "-Q", queue, "--broker",
                       broker_url)
    printed = json.loads(out)["id"]
    worker = finish(start_worker(broker_url, queue, env=worker_env(broker_url)))
    assert code == 0 and "unknown task" in worker, worker
    code, out, err = run(capsys, "dead-letters", "show", printed, *flags)
    assert code == 0, err
    assert f"message_id:  {printed}" in out and "unknown task 'billing.nowhere'" in out
    code, out, _ = run(capsys, "dead-letters", "list", "--json", *flags)
    [row] = json.loads(out)["dead_letters"]
    assert row["message_id"] == printed
    code, by_dead_id, _ = run(capsys, "dead-letters", "show", row["id"], *flags)
    assert code == 0 and f"message_id:  {printed}" in by_dead_id


def test_a_message_dead_twice_is_shown_twice_and_raw_asks_which(
        capsys: pytest.CaptureFixture[str], broker_url: str, clean_env: Path,
        unique: str) -> None:
    queue = f"q-{unique}"
    flags = ["-Q", queue, "--broker", broker_url, "--state", f"sqlite:///{clean_env}/s.db"]
    message = Message(queue=queue, task="billing.twice")
    body = Codec().encode(message)
    dead_letter_bodies(broker_url, queue, [body, body], "oom_killed: exceeded 64 MiB")
    code, out, _ = run(capsys, "dead-letters", "show", message.id, *flags)
    assert code == 0 and out.count(f"message_id:  {message.id}") == 2, out
    for flag in ("--raw", "--json"):
        code, out, err = run(capsys, "dead-letters", "show", message.id, flag, *flags)
        assert (code, out) == (2, "") and "names 2 dead letters" in err
        assert len(err.splitlines()) == 1


def test_list_shows_whole_reasons_wrapped_to_the_terminal_or_wide(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, broker_url: str,
        clean_env: Path, unique: str) -> None:
    queue = f"q-{unique}"
    flags = ["-Q", queue, "--broker", broker_url, "--state", f"sqlite:///{clean_env}/s.db"]
    reason = ("failed: ValueError('the partner API answered 422 Unprocessable Entity for "
              "invoice 2026-11-23/7731 because its currency field was empty') on its last "
              "attempt of 4, ends-here-" + unique)
    dead_letter(broker_url, queue, ["billing.send_invoice"], reason)
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: set by some shells and runners
    code, out, _ = run(capsys, "dead-letters", "list", *flags)
    assert code == 0 and reason in out.splitlines()[1], "into a pipe: one line per dead letter"
    for columns in (160, 100, 60):   # wrapped in its column; under the row when narrow
        monkeypatch.setenv("COLUMNS", str(columns))
        code, out, _ = run(capsys, "dead-letters", "list", *flags)
        assert code == 0 and max(len(line) for line in out.splitlines()) <= max(
            columns, len(out.splitlines()[0])), out
        assert len(out.splitlines()) > 2, out
        assert " ".join(reason.split()) in " ".join(out.split()), f"lost words:\n{out}"
    code, out, _ = run(capsys, "dead-letters", "list", "--wide", *flags)
    assert code == 0 and reason in out.splitlines()[1]


def test_show_previews_a_binary_or_huge_body_and_raw_gives_every_byte(
        capsys: pytest.CaptureFixture[str], broker_url: str, clean_env: Path,
        unique: str) -> None:
    queue = f"q-{unique}"
    flags = ["-Q", queue, "--broker", broker_url, "--state", f"sqlite:///{clean_env}/s.db"]
    binary = bytes(range(256)) * 800 + b"\x1b[2J"          # 200 KiB, with a terminal escape
    text = ("line of a huge text body\n" * 20_000).encode()  # 500 KB of text
    dead_letter_bodies(broker_url, queue, [binary, text], "bad message: not JSON")
    code, out, _ = run(capsys, "dead-letters", "list", "--json", *flags)
    ids = [r["id"] for r in json.loads(out)["dead_letters"]]
    assert len(ids) == 2, out
    shown = {}
    for dead_id in ids:
        code, out, _ = run(capsys, "dead-letters", "show", dead_id, *flags)
        assert code == 0 and len(out) < 20_000, f"show printed {len(out)} characters"
        assert all(c.isprintable() or c == "\n" for c in out), "show printed control bytes"
        shown[dead_id] = out
        raw = cli_bytes("dead-letters", "show", dead_id, "--raw", *flags)
        assert raw.returncode == 0 and raw.stdout in (binary, text), raw.stderr
        shown[dead_id] += f"RAW={raw.stdout == binary}"
    [as_hex] = [o for o in shown.values() if o.endswith("RAW=True")]
    assert "body: 204,804 bytes, not text" in as_hex and "00 01 02 03" in as_hex
    [cut] = [o for o in shown.values() if o.endswith("RAW=False")]
    assert "body (500,000 bytes), the first 16,384 characters" in cut and "--raw" in cut


def test_celery_intake_rejections_show_up_without_naming_their_queue(
        capsys: pytest.CaptureFixture[str], broker_url: str, clean_env: Path,
        unique: str) -> None:
    """A pickled Celery message is rejected by the intake of a running worker; status and
    dead-letters list find it (on celery.<queue>.rejected) with no -Q, show by its task id."""
    from tests.integration.celery_app import producer
    require_service("redis")
    celery_queue = f"cq-{unique}"
    state = f"sqlite:///{clean_env}/s.db"
    flags = ["--broker", broker_url, "--state", state]
    keyprefix = f"{unique}:"  # Celery's keys on Redis, deleted with the prefix below
    app = producer(REDIS_URL, REDIS_URL, celery_queue, keyprefix)
    # its own work queue: "default" on the shared RabbitMQ would outlive the test (the
    # cleanup deletes only names holding `unique`) and clash with anyone else's "default"
    worker = start_worker(broker_url, f"q-{unique}", f"--celery-queues={celery_queue}",
                          f"--celery-broker={REDIS_URL}?global_keyprefix={keyprefix}", burst=False,
                          env=worker_env(broker_url, CONVEYOR_STATE_URL=state))
    try:
        pickled = app.send_task("t.add", args=(1, 2), serializer="pickle")
        rejected = f"celery.{celery_queue}.rejected"
        row = wait_for_dead_letter(capsys, flags, rejected, worker)
        assert row["message_id"] == pickled.id and "pickle" in row["reason"]
        # RabbitMQ: the listing browses the dead letters (get, then nack), and the depth
        # that status reads counts one again only once the broker applied the nack
        def dead_in_status() -> bool:
            code, out, _ = run(capsys, "status", "--json", *flags)
            [depth] = [q for q in json.loads(out)["queues"] if q["queue"] == rejected]
            return code == 0 and depth["dead"] == 1
        wait_for(dead_in_status, timeout=15, what=f"status to count {rejected}'s dead letter")
        code, out, _ = run(capsys, "dead-letters", "show", pickled.id, *flags)
        assert code == 0 and f"queue:       {rejected}" in out and "body_base64" in out
    finally:
        worker.terminate()
        worker.communicate(timeout=60)
        app.close()
        delete_redis_prefix(unique)


def wait_for_dead_letter(capsys: pytest.CaptureFixture[str], flags: list[str], queue: str,
                         worker: subprocess.Popen[str]) -> dict[str, object]:
    """The first dead letter `dead-letters list` (no -Q) shows on `queue`, within 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and worker.poll() is None:
        code, out, err = run(capsys, "dead-letters", "list", "--json", *flags)
        assert code == 0, err
        rows = [r for r in json.loads(out)["dead_letters"] if r["queue"] == queue]
        if rows:
            return dict(rows[0])
        time.sleep(0.2)
    worker.terminate()
    raise AssertionError(f"no dead letter on {queue}:\n{worker.communicate(timeout=60)[0]}")


def test_dead_letters_of_a_queue_nobody_consumes_show_in_list_and_status(
        capsys: pytest.CaptureFixture[str], broker_url: str, clean_env: Path,
        unique: str) -> None:
    """No -Q, no worker on the queue, no run naming it: the broker's own listing finds it."""
    queue = f"orphan-{unique}"
    flags = ["--broker", broker_url, "--state", f"sqlite:///{clean_env}/s.db"]
    dead_letter(broker_url, queue, ["app.lost"], "unknown task: no --app registers it")

    def listed() -> list[dict[str, object]]:
        code, out, err = run(capsys, "dead-letters", "list", "--json", *flags)
        assert code == 0, err
        return [r for r in json.loads(out)["dead_letters"] if r["queue"] == queue]

    # RabbitMQ's management statistics (how its dead queues are found) lag a few seconds
    [row] = wait_for(listed, timeout=30, what=f"{queue}'s dead letter in dead-letters list")
    assert row["task"] == "app.lost"
    code, out, _ = run(capsys, "status", "--json", *flags)
    [shown] = [q for q in json.loads(out)["queues"] if q["queue"] == queue]
    assert code == 0 and shown["dead"] == 1
    with from_url(broker_url) as broker:
        broker.purge(queue)


def test_on_kombu_the_listing_says_it_is_partial_and_q_shows_the_queue(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        clean_env: Path, unique: str) -> None:
    """kombu cannot list its queues: `dead-letters list` and `status` still show what they
    know and warn that a queue nobody consumes must be named; with -Q it shows."""
    require_service("redis")
    url = f"kombu+{REDIS_URL}?prefix={unique}:"
    queue = f"orphan-{unique}"
    flags = ["--broker", url, "--state", f"sqlite:///{clean_env}/s.db"]
    try:
        dead_letter(url, queue, ["app.lost"], "unknown task: no --app registers it")
        for command in (["dead-letters", "list"], ["status"]):
            caplog.clear()
            code, out, err = run(capsys, *command, "--json", *flags)
            assert code == 0, err
            assert ("queues holding dead letters are not all listed (pass them with -Q): a "
                    "kombu transport cannot list its queues") in caplog.text
            assert queue not in out
        code, out, err = run(capsys, "dead-letters", "list", "--json", "-Q", queue, *flags)
        assert [r["task"] for r in json.loads(out)["dead_letters"]] == ["app.lost"]
    finally:
        delete_redis_prefix(unique)
