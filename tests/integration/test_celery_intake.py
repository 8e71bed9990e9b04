"""Celery intake end to end: an unchanged Celery producer, real `conveyor worker` processes.

The producer (`celery_app.py`, Celery as a test dependency) publishes with `send_task` and
`apply_async` on Redis or RabbitMQ and waits with `AsyncResult.get()`; no Celery worker runs.
Conveyor's own broker is the native Redis transport under the test's unique prefix. Every
test deletes what it made: Conveyor's keys, Celery's queue (and exchange on RabbitMQ), and
the result documents.
"""

from __future__ import annotations

import base64
import gc
import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote
from urllib.request import Request, urlopen

import pytest
import redis
from celery import Celery
from celery.exceptions import TaskRevokedError
from kombu.exceptions import ContentDisallowed

from conveyor.broker import Broker, from_url
from conveyor.celery_intake.feed import celery_connection
from conveyor.celery_intake.redis_feed import RedisFeed
from conveyor.client import Client
from tests.conftest import RABBITMQ_URL, REDIS_URL, delete_redis_prefix, require_service
from tests.integration.celery_app import producer
from tests.integration.workerkit import APP, ROOT, worker_env
from tests.support import Proxy, wait_for
from tests.tracing_export import EXPORTER, read

pytestmark = pytest.mark.slow

CELERY_BROKERS = {"redis": REDIS_URL, "rabbitmq": RABBITMQ_URL}


@dataclass
class Setup:
    """One test's Celery producer, Conveyor broker URL and queue, and what to clean up."""

    app: Celery
    celery_broker: str
    conveyor_url: str
    queue: str
    logs: Path
    keyprefix: str = ""  # Celery's keys on Redis (global_keyprefix): the test's own
    task_ids: list[str] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def worker(self, *flags: str, **env: str) -> subprocess.Popen[bytes]:
        """A real `conveyor worker` taking this test's Celery queue, output to a log file."""
        log = (self.logs / f"worker{len(self.workers)}.log").open("wb")
        argv = [sys.executable, "-m", "conveyor.cli", "worker", "--queues=default",
                f"--celery-queues={self.queue}", f"--celery-broker={self.celery_url()}",
                f"--celery-result-backend={REDIS_URL}", f"--app={APP}",
                "--heartbeat-interval=1", "--concurrency=2", *flags]
        proc = subprocess.Popen(argv, cwd=ROOT, env=worker_env(self.conveyor_url, **env),
                                stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.workers.append(proc)
        return proc

    def celery_url(self, **options: object) -> str:
        """Celery's broker URL for `--celery-broker`: with the test's key prefix, if any."""
        if self.keyprefix:
            options = {"global_keyprefix": self.keyprefix, **options}
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"{self.celery_broker}?{query}" if query else self.celery_broker

    def output(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.logs.glob("worker*.log")))

    def get(self, result: Any, timeout: float = 30) -> Any:
        self.task_ids.append(result.id)
        return result.get(timeout=timeout)


@pytest.fixture(params=sorted(CELERY_BROKERS))
def setup(request: pytest.FixtureRequest, unique: str, tmp_path: Path) -> Iterator[Setup]:
    require_service("redis")
    require_service(request.param)
    celery_broker = CELERY_BROKERS[request.param]
    queue = f"cq-{unique}"
    keyprefix = f"{unique}:" if request.param == "redis" else ""  # deleted with the prefix
    s = Setup(producer(celery_broker, REDIS_URL, queue, keyprefix), celery_broker,
              f"{REDIS_URL}?prefix={unique}", queue, tmp_path, keyprefix)
    yield s
    for proc in s.workers:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    with warnings.catch_warnings():   # what Celery's results leave open when collected
        warnings.simplefilter("ignore", ResourceWarning)
        s.app.close()
        gc.collect()
    delete_redis_prefix(unique)
    delete_celery_side(request.param, queue, s.task_ids)


def delete_celery_side(kind: str, queue: str, task_ids: list[str]) -> None:
    """Celery's queue and binding (Redis) or queue and exchange (RabbitMQ), and results."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.delete(*[f"celery-task-meta-{i}" for i in task_ids], queue,
                      f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    finally:
        client.close()
    if kind == "rabbitmq":
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        for what in ("queues", "exchanges"):
            request = Request(f"http://127.0.0.1:15672/api/{what}/%2F/{quote(queue)}",
                              method="DELETE", headers={"Authorization": auth})
            try:
                urlopen(request, timeout=10).close()
            except OSError:
                pass  # already gone


def test_celery_producer_gets_its_results_from_conveyor(setup: Setup) -> None:
    app = setup.app
    setup.worker()
    sent = app.send_task("t.add", args=(2, 3))
    published = time.time()
    later = app.tasks["t.add"].apply_async((10, 20), countdown=2)
    failing = app.tasks["t.fail"].apply_async(("kaput",))
    assert setup.get(sent) == 5, setup.output()
    assert setup.get(later) == 30, setup.output()
    assert time.time() - published >= 2, "a countdown task ran before its eta"
    with pytest.raises(ValueError, match="kaput"):
        setup.get(failing)


def test_a_traced_celery_producers_trace_goes_on_in_conveyor(setup: Setup,
                                                            tmp_path: Path) -> None:
    """The W3C context OpenTelemetry's Celery instrumentation puts in the headers: the
    intake's `enqueue` span, and so the whole task, join the producer's trace."""
    spans_file = tmp_path / "spans.jsonl"
    setup.worker(CONVEYOR_TRACING=EXPORTER, CONVEYOR_TEST_SPANS=str(spans_file))
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    sent = setup.app.send_task("t.add", args=(2, 3),
                               headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    assert setup.get(sent) == 5, setup.output()
    wait_for(lambda: spans_file.exists() and any(
        s["name"] == "outcome t.add" for s in read(spans_file)), what="the outcome span")
    spans = {s["name"]: s for s in read(spans_file)}
    assert {s["trace"] for s in spans.values()} == {trace_id}
    assert spans["enqueue t.add"]["parent"] == parent
    assert spans["claim t.add"]["parent"] == spans["enqueue t.add"]["span"]
    assert spans["run t.add"]["parent"] == spans["claim t.add"]["span"]


@pytest.fixture
def reference_worker(setup: Setup) -> Iterator[str]:
    """A real Celery worker (solo pool) on a queue of its own, same broker and backend;
    yields its queue."""
    queue = f"{setup.queue}-reference"
    env = {**os.environ, "REFERENCE_BROKER": setup.celery_broker,
           "REFERENCE_BACKEND": REDIS_URL, "REFERENCE_QUEUE": queue,
           "REFERENCE_KEYPREFIX": setup.keyprefix}
    log = (setup.logs / "reference.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.celery_worker_app", "worker",
         "--pool=solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
         "--loglevel=WARNING", "-n", f"reference-{queue}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    yield queue
    proc.kill()
    proc.wait(timeout=30)
    delete_celery_side("rabbitmq" if "amqp" in setup.celery_broker else "redis", queue, [])


@pytest.mark.parametrize("name", ["t.key_error", "t.os_error"])
def test_a_failure_is_stored_as_a_real_celery_worker_stores_it(
        setup: Setup, reference_worker: str, name: str) -> None:
    """The same failing task on a real Celery worker and through the intake: the result
    documents agree field by field (but for time and traceback paths), and `get()` raises
    the same exception with the same args (OSError keeps its errno)."""
    if "amqp" in setup.celery_broker:
        pytest.skip("results are written the same way whatever Celery's broker; run on Redis")
    setup.worker()
    theirs = setup.app.send_task(name, queue=reference_worker)
    ours = setup.app.send_task(name)
    raised = [_raised(setup, r) for r in (theirs, ours)]
    assert raised[0] == raised[1], setup.output()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        docs = [json.loads(client.get(f"celery-task-meta-{r.id}")) for r in (theirs, ours)]
    finally:
        client.close()
    assert sorted(docs[0]) == sorted(docs[1])
    for field_name in ("status", "result", "children"):
        assert docs[0][field_name] == docs[1][field_name], field_name
    last_lines = [d["traceback"].strip().splitlines()[-1] for d in docs]
    assert last_lines[0] == last_lines[1]


def _raised(setup: Setup, result: Any) -> tuple[str, tuple[Any, ...], Any]:
    """What `get()` raises: its type, args and errno."""
    with pytest.raises(Exception) as caught:
        setup.get(result)
    exc = caught.value
    return type(exc).__qualname__, exc.args, getattr(exc, "errno", None)


def test_pickled_and_expired_messages_are_dead_lettered_with_reasons(setup: Setup) -> None:
    """The worker consumes first: on RabbitMQ Celery gives an expired message a TTL of 0,
    so RabbitMQ itself drops it unless a consumer takes it at once. The pickled one is
    refused by the intake (`celery.Q.rejected`); the expired one is converted and
    dead-lettered by the worker, as any message past its `expires` (`celery.Q`)."""
    app = setup.app
    setup.worker()
    assert setup.get(app.send_task("t.add", args=(4, 4))) == 8, setup.output()
    pickled = app.send_task("t.add", args=(1, 2), serializer="pickle")
    expired = app.send_task("t.add", args=(1, 2),
                            expires=datetime.now(UTC) - timedelta(seconds=5))
    with pytest.raises(ContentDisallowed, match="pickle"):
        setup.get(pickled)
    with pytest.raises(TaskRevokedError, match="expired"):
        setup.get(expired)
    broker = from_url(setup.conveyor_url)
    try:
        dead = wait_dead(broker, f"celery.{setup.queue}.rejected", 1)
        [late] = wait_dead(broker, f"celery.{setup.queue}", 1)
    finally:
        broker.close()
    by_id = {json.loads(d.body)["id"]: d for d in dead}
    assert "pickle" in by_id[pickled.id].reason and "never deserializes" in by_id[pickled.id].reason
    assert json.loads(late.body)["id"] == expired.id
    assert late.reason.startswith("expired: not started by its deadline"), late.reason
    kept = json.loads(by_id[pickled.id].body)
    assert kept["content_type"] == "application/x-python-serialize"
    assert base64.b64decode(kept["body_base64"]).startswith(b"\x80")  # pickle, still opaque


def test_a_celery_expires_that_passes_while_the_task_waits_is_revoked_not_run(
        setup: Setup) -> None:
    """Still ahead when the intake converts it, Celery's `expires` becomes the message's
    own: both slots busy past it, the worker acks it unrun and Celery reads REVOKED."""
    app = setup.app
    setup.worker()
    # The 2 s start only once the intake converts: a worker still starting on a loaded machine
    # let RabbitMQ drop the message by the TTL Celery sets from expires (nothing to revoke).
    assert setup.get(app.send_task("t.add", args=(0, 0)), timeout=60) == 0, setup.output()
    busy = [app.send_task("t.sleep", args=(4,)) for _ in range(2)]
    late = app.send_task("t.add", args=(1, 2), expires=datetime.now(UTC) + timedelta(seconds=2))
    with pytest.raises(TaskRevokedError, match="expired"):
        setup.get(late)
    assert [setup.get(r) for r in busy] == ["slept", "slept"], setup.output()
    assert "expired: not started by its deadline" in setup.output()


def test_revoke_keeps_a_queued_task_from_starting_and_terminate_stops_a_running_one(
        setup: Setup, tmp_path: Path) -> None:
    """Celery's `revoke()` reaches the intake as a pidbox broadcast: without terminate a
    queued task never starts and a running one goes on; with terminate it is stopped."""
    app = setup.app
    setup.worker("--concurrency=1", "--cancel-grace=1")
    started, never = tmp_path / "running.pid", tmp_path / "queued.pid"
    running = app.send_task("t.sleep", args=(60, str(started)))
    queued = app.send_task("t.sleep", args=(60, str(never)))
    wait_for(started.exists, what="the first task to start", detail=setup.output)
    pid = int(started.read_text())
    replies = wait_for(lambda: app.control.revoke(queued.id, reply=True, timeout=1.0),
                       what="the intake to answer a revoke", detail=setup.output)
    assert any(f"tasks {queued.id} flagged as revoked" in str(r) for r in replies)
    app.control.revoke(running.id)                    # no terminate: it goes on
    time.sleep(1.5)
    assert pid_alive(pid), setup.output()
    app.control.revoke(running.id, terminate=True)
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the running task to be stopped",
             detail=setup.output)
    for result in (running, queued):
        with pytest.raises(TaskRevokedError, match="revoked"):
            setup.get(result, timeout=15)
    assert not never.exists()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_dead(broker: Broker, queue: str, count: int, timeout: float = 10) -> list[Any]:
    deadline = time.monotonic() + timeout
    dead = broker.dead_letters(queue)
    while len(dead) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        dead = broker.dead_letters(queue)
    assert len(dead) == count, dead
    return dead


def test_kill_9_of_the_worker_mid_task_loses_nothing(setup: Setup, tmp_path: Path) -> None:
    if "amqp" in setup.celery_broker:
        pytest.skip("the Conveyor side is the same on both Celery brokers; run once, on Redis")
    log = tmp_path / "tasks.log"
    app = setup.app
    hanging = app.send_task("t.hang_once", args=(str(log), "A"))
    quick = app.send_task("t.record", args=(str(log), "B"))
    doomed = setup.worker()
    assert setup.get(quick) == "B", setup.output()
    wait_for(lambda: "start A" in log.read_text(), what="task A to start",
             ignore=(FileNotFoundError,))
    doomed.kill()
    doomed.wait(timeout=30)
    runner = int(next(x for x in log.read_text().splitlines() if x.startswith("start A"))
                 .split()[2])
    wait_for(lambda: not _alive(runner), what="the killed worker's runner to die",
             ignore=(FileNotFoundError,))
    after = app.send_task("t.record", args=(str(log), "C"))  # published while none runs
    setup.worker()
    assert setup.get(hanging, timeout=60) == "A", setup.output()
    assert setup.get(after) == "C", setup.output()
    assert log.read_text().count("done A") == 1


def test_kill_9_while_the_feed_moves_a_backlog_loses_nothing(setup: Setup,
                                                             tmp_path: Path) -> None:
    """Killed while batches are between Celery's queue and Conveyor's: every task still runs
    (some twice: a batch published but not yet acked on Celery's side comes back). On Redis
    the feed takes batches atomically (redis_feed.py) and kombu gives unacked messages back
    after the visibility timeout, 2 s here."""
    log, n = tmp_path / "tasks.log", 600
    for i in range(n):
        setup.app.send_task("t.record", args=(str(log), f"m{i}"), ignore_result=True)
    flags = ["--max-tasks-per-child=100"]
    if "redis" in setup.celery_broker:
        flags.append(f"--celery-broker={setup.celery_url(visibility_timeout=2)}")
    doomed = setup.worker(*flags)
    conveyor = from_url(setup.conveyor_url)
    try:
        wait_for(lambda: conveyor.depth(f"celery.{setup.queue}").active > 0,
                 what="the feed to move a first batch", detail=setup.output)
    finally:
        conveyor.close()
    doomed.kill()
    doomed.wait(timeout=30)
    setup.worker(*flags)
    wait_for(lambda: len(_done(log)) >= n, 100, what=f"all {n} tasks to run",
             detail=lambda: f"never ran: {sorted({f'm{i}' for i in range(n)} - _done(log))}")
    missing = {f"m{i}" for i in range(n)} - _done(log)
    started = [x for x in log.read_text().splitlines() if x.split()[1] in missing]
    assert not missing, f"{len(missing)} never ran, e.g. {sorted(missing)[:5]} ({started})"


def _done(log: Path) -> set[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return {line.split()[1] for line in lines if line.startswith("done")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize(("flags", "says"), [
    (["--celery-queues=celery"], "--celery-queues needs --celery-broker"),
    (["--celery-queues=celery", "--celery-broker=redis://127.0.0.1:1/0"],
     "Celery broker redis://127.0.0.1:1/0 is unreachable")])
def test_bad_intake_config_stops_the_worker_at_start_with_one_line(
        flags: list[str], says: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "worker", f"--app={APP}", *flags],
        cwd=ROOT, env=worker_env(f"sqlite:///{tmp_path}/broker.db"), capture_output=True,
        text=True, timeout=60)
    assert done.returncode != 0
    assert says in done.stderr.strip().splitlines()[-1], done.stderr


def test_the_redis_feed_takes_what_a_killed_feed_left_staged_and_rejects_garbage(
        unique: str, tmp_path: Path) -> None:
    """A message BLMOVEd to staging by a feed killed before its next step is moved by the
    next feed; a list item that is not kombu's envelope is rejected with a reason, not
    lost and not fatal; nothing stays in kombu's unacked hash once the batch is moved."""
    require_service("redis")
    prefix, queue = f"{unique}:", "cq"
    app = Celery("staging-test", broker=REDIS_URL,
                 broker_transport_options={"global_keyprefix": prefix})
    sent = app.send_task("t.add", args=(1, 2), queue=queue)
    app.close()
    raw = redis.Redis.from_url(REDIS_URL)
    broker = from_url(f"sqlite:///{tmp_path}/broker.db")
    feed = RedisFeed(celery_connection(f"{REDIS_URL}?global_keyprefix={prefix}"), (queue,),
                     Client(broker), lambda name: None)
    try:
        raw.lmove(prefix + queue, f"{prefix}_conveyor.intake.staging.{queue}")
        raw.lpush(prefix + queue, b"not kombu's envelope")
        assert feed.move() == 2
        moved = next(broker.consume([f"celery.{queue}"], timeout=2.0))
        assert moved is not None and json.loads(moved.body)["id"] == sent.id
        broker.ack(moved)
        rejected = next(broker.consume([f"celery.{queue}.rejected"], timeout=2.0))
        assert rejected is not None
        kept = json.loads(rejected.body)
        assert "is not accepted" in kept["reason"]
        assert base64.b64decode(kept["body_base64"]) == b"not kombu's envelope"
        assert raw.hlen(prefix + "unacked") == raw.zcard(prefix + "unacked_index") == 0
    finally:
        feed.connection.release()
        broker.close()
        keys = list(raw.scan_iter(match=f"{prefix}*"))
        if keys:
            raw.delete(*keys)
        raw.close()


def test_a_batch_a_killed_feed_held_comes_back_while_the_restore_mutex_is_stuck(
        unique: str, tmp_path: Path) -> None:
    """kombu's restore takes one mutex for every consumer of the Redis server, kept 5
    minutes when its holder is killed: the feed's own restore must not wait for it."""
    require_service("redis")
    prefix, queue = f"{unique}:", "cq"
    app = Celery("restore-test", broker=REDIS_URL,
                 broker_transport_options={"global_keyprefix": prefix})
    sent = [app.send_task("t.add", args=(i, i), queue=queue).id for i in range(5)]
    app.close()
    raw = redis.Redis.from_url(REDIS_URL)
    broker = from_url(f"sqlite:///{tmp_path}/broker.db")
    url = f"{REDIS_URL}?global_keyprefix={prefix}&visibility_timeout=1"
    killed = RedisFeed(celery_connection(url), (queue,), Client(broker), lambda name: None)
    feed = RedisFeed(celery_connection(url), (queue,), Client(broker), lambda name: None)
    try:
        keys = [killed._staging, killed._unacked, killed._index,
                *(k for _, k in killed._queue_keys)]
        assert len(killed._take(keys=keys, args=[64, time.time()])) == 3 * 5  # then "killed"
        raw.set(prefix + "unacked_mutex", "a consumer killed while restoring", ex=300)
        assert feed.move() == 0
        time.sleep(1.1)  # past the visibility timeout
        feed._restore_if_due()
        assert feed.move() == 5
        ids = set()
        for _ in range(5):
            moved = next(broker.consume([f"celery.{queue}"], timeout=2.0))
            assert moved is not None
            ids.add(json.loads(moved.body)["id"])
            broker.ack(moved)
        assert ids == set(sent)
        assert raw.hlen(prefix + "unacked") == raw.zcard(prefix + "unacked_index") == 0
    finally:
        for f in (killed, feed):
            f.connection.release()
        broker.close()
        keys = list(raw.scan_iter(match=f"{prefix}*"))
        if keys:
            raw.delete(*keys)
        raw.close()


def test_the_redis_feed_rides_out_a_lost_redis_connection(
        unique: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Redis away under a running feed (a Proxy cut): one line per turn tried again, the
    feed does not stop; Redis back, it moves a message sent then."""
    require_service("redis")
    prefix, queue = f"{unique}:", "cq"
    proxy = Proxy("127.0.0.1", 6379)
    broker = from_url(f"sqlite:///{tmp_path}/broker.db")
    feed = RedisFeed(celery_connection(f"redis://{proxy.address}/0?global_keyprefix={prefix}"),
                     (queue,), Client(broker), lambda name: None)
    caplog.set_level(logging.WARNING, logger="conveyor.celery_intake")
    running = threading.Thread(target=feed.run, daemon=True)
    running.start()
    try:
        proxy.cut()
        wait_for(lambda: sum("trying again in 1 s" in r.getMessage()
                             for r in caplog.records) >= 2, 20, "two turns tried again")
        assert running.is_alive()
        proxy.restore()
        app = Celery("outage-test", broker=REDIS_URL,
                     broker_transport_options={"global_keyprefix": prefix})
        sent = app.send_task("t.add", args=(1, 2), queue=queue)
        app.close()
        moved = next(broker.consume([f"celery.{queue}"], timeout=20.0))
        assert moved is not None and json.loads(moved.body)["id"] == sent.id
    finally:
        feed.should_stop = True
        running.join(timeout=10)
        proxy.cut()
        feed.connection.release()
        broker.close()
        delete_redis_prefix(unique)
