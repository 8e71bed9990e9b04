"""Only the current attempt runs, and a dead scheduler's claims do not wait (issue 27).

* A DAG attempt the scheduler timed out never runs, whenever a worker comes: the scheduler
  stamps each attempt's message with the time by which it must have started (`expires` =
  publish + queued_timeout) and times the attempt out only `start_grace` later; a worker
  acks a message past its `expires` unrun and reports `expired`.
* A scheduler killed between claiming an attempt for publishing and publishing it: another
  scheduler, alive and idle all along, publishes it once the dead one's lease lapses
  (seconds), and it runs once.

Each test runs schedulers and real `conveyor worker` processes on a real broker and state
store; the task's body appends to a ledger, so an attempt that ran twice would show there.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conveyor.message import Message
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import Daemon, build
from conveyor.scheduler.folder import load_folder
from conveyor.scheduler.runs import trigger
from conveyor.state.store import Store, from_url
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    REDIS_URL,
    clean_transport,
    drop_postgres_schema,
    require_service,
)
from tests.integration.workerkit import (
    Logs,
    enqueue,
    events,
    finish,
    open_broker,
    start_worker,
    worker_env,
)
from tests.support import spawn, stop, wait_for

GRACE = 1.0
LEASE = 2.0
ROOT = Path(__file__).parents[2]
# broker -> state store: each broker once, each state store twice
PAIRS = {"sqlite": "sqlite", "redis": "postgres", "rabbitmq": "sqlite",
         "postgres": "postgres"}
BROKERS = {"sqlite": "sqlite:///{tmp}/broker.db", "redis": REDIS_URL + "?prefix={name}",
           "rabbitmq": RABBITMQ_URL, "postgres": POSTGRES_URL + "?schema={name}b"}
STATES = {"sqlite": "sqlite:///{tmp}/state.db", "postgres": POSTGRES_URL + "?schema={name}s"}


@dataclass
class Stack:
    broker_url: str
    state_url: str
    queue: str
    name: str
    ledger: Path
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def worker(self, *flags: str, burst: bool = True) -> subprocess.Popen[str]:
        """A `conveyor worker` on this stack's queue; the fixture kills it (by pid) if it
        still runs when the test ends, however the test ended."""
        proc = start_worker(self.broker_url, self.queue, *flags, burst=burst,
                            env=worker_env(self.broker_url))
        self.started.append(proc)
        return proc


@pytest.fixture(params=sorted(PAIRS))
def stack(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[Stack]:
    broker, state = request.param, PAIRS[request.param]
    for service in {broker, state} - {"sqlite"}:
        require_service(service)
    made = Stack(BROKERS[broker].format(tmp=tmp_path, name=unique),
                 STATES[state].format(tmp=tmp_path, name=unique), f"work-{unique}", unique,
                 tmp_path / "ledger")
    yield made
    for proc in made.started:
        if proc.poll() is None:
            proc.kill()
            finish(proc)
    clean_transport(broker, unique if broker != "postgres" else f"{unique}b")
    if state == "postgres":
        drop_postgres_schema(f"{unique}s")


def ledger_dag(stack: Stack, queued_timeout: float, retries: int) -> DAG:
    dag = DAG("stale", retries=retries, retry_delay=0)
    dag.command("work", ["sh", "-c", f"echo ran >> {stack.ledger}"], queue=stack.queue,
                queued_timeout=queued_timeout)
    dag.validate(["queue"])
    return dag


@pytest.fixture
def scheduler(stack: Stack) -> Iterator[Callable[[DAG], None]]:
    """`scheduler(dag)` triggers a run of `dag` and runs the scheduler daemon on a thread
    until the test ends."""
    started: list[tuple[Daemon, threading.Thread]] = []

    def start(dag: DAG) -> None:
        config = SchedulerConfig.from_env(
            {}, broker_url=stack.broker_url, state_url=stack.state_url,
            events_queue=f"events-{stack.name}", control_queue=f"control-{stack.name}",
            start_grace=GRACE, queue_sample_interval=0.0)
        daemon = build(config, {dag.dag_id: dag})
        trigger(daemon.engine.store, dag, time.time(), executors=["queue"])
        thread = threading.Thread(target=daemon.run, name="scheduler")
        thread.start()
        started.append((daemon, thread))

    yield start
    for daemon, thread in started:
        daemon.stop()
        thread.join(30)
        daemon.close()


def gated(stack: Stack) -> list[str]:
    """A command that writes `start`, waits for the file `go` beside the ledger, and writes
    `done`: a run lasts exactly as long as the test wants (a fixed `sleep` either ended
    before the test's kill on a loaded machine or made every second run wait it out)."""
    go = stack.ledger.with_name("go")
    return ["sh", "-c", f"echo start >> {stack.ledger}; "
                        f"until [ -e {go} ]; do sleep 0.05; done; echo done >> {stack.ledger}"]


def consuming(stack: Stack, *flags: str) -> tuple[subprocess.Popen[str], Logs]:
    """A worker of the stack's, once it consumes: an attempt published to it is not short
    of its `expires` by a worker's start-up (seconds on a loaded machine: with 3 s, the
    first attempt could expire unrun and the run fail before the test saw it start)."""
    proc = stack.worker(*flags, burst=False)
    log = Logs(proc)
    wait_for(log.consuming, 60, "the worker to consume", detail=log.text)
    return proc, log


def the_task(store: Store) -> dict[str, object]:
    run = store.rows("recent_runs", dag_id="stale", state="", limit=1)[0]
    return dict(store.rows("run_tis", run_id=run["run_id"])[0], run_state=run["state"])


def attempts(store: Store) -> list[dict[str, object]]:
    run = store.rows("recent_runs", dag_id="stale", state="", limit=1)[0]
    return store.rows("run_attempts", run_id=run["run_id"])


def test_timed_out_attempts_never_run_when_a_worker_comes_later(
        stack: Stack, scheduler: Callable[[DAG], None]) -> None:
    """queued_timeout=2, retries=1, nobody consuming: the run fails after both attempts
    time out; a worker started afterwards acks both messages unrun (`expired`)."""
    scheduler(ledger_dag(stack, queued_timeout=2, retries=1))
    store = from_url(stack.state_url)
    try:
        wait_for(lambda: the_task(store)["run_state"] == "failed", timeout=60,
                 what="the run to fail by queued timeouts")
        worker = stack.worker()
        out = finish(worker)
        done = attempts(store)
        broker = open_broker(stack.broker_url)
        dead = broker.dead_letters(stack.queue)   # stale attempts are dropped, not kept
        broker.close()
    finally:
        store.close()
    assert not stack.ledger.exists(), f"a timed-out attempt ran:\n{out}"
    assert out.count("expired: not started by its deadline") == 2, out
    assert out.count("acked unrun (a DAG attempt)") == 2 and dead == [], (out, dead)
    assert [(a["outcome"], a["started_at"]) for a in done] == [("queued_timeout", None)] * 2


def test_a_late_worker_runs_the_current_attempt_once(
        stack: Stack, scheduler: Callable[[DAG], None]) -> None:
    """queued_timeout=4, retries=2, the worker starts once attempt 1 was timed out: it
    refuses attempt 1's message and runs a later attempt; the body ran exactly once."""
    scheduler(ledger_dag(stack, queued_timeout=4, retries=2))
    store = from_url(stack.state_url)
    try:
        wait_for(lambda: the_task(store)["attempt"] == 2, timeout=60,
                 what="attempt 1 to time out")
        worker = stack.worker(burst=False)
        try:
            wait_for(lambda: the_task(store)["run_state"] != "running", timeout=60,
                     what="the run to end")
        finally:
            worker.terminate()
            out = finish(worker)
        task, done = the_task(store), attempts(store)
    finally:
        store.close()
    assert task["state"] == "success" and task["run_state"] == "success", (task, out)
    assert stack.ledger.read_text() == "ran\n", out
    assert "expired: not started by its deadline" in out   # attempt 1's message
    assert [a["outcome"] for a in done[:-1]] == ["queued_timeout"] * (len(done) - 1)
    assert done[-1]["outcome"] == "succeeded"


def test_a_plain_message_past_its_expires_is_reported_not_run(stack: Stack) -> None:
    """Outside DAGs too: a message with `expires` behind it is dead-lettered unrun (reason
    `expired`) and reported `expired` to its reply_to; one still within it runs."""
    broker = open_broker(stack.broker_url)
    replies = f"replies-{stack.name}"
    try:
        now = time.time()
        stale = enqueue(broker, Message(queue=stack.queue, task="t.record", args=(
            str(stack.ledger), "stale"), reply_to=replies, expires=now + 0.5))
        enqueue(broker, Message(queue=stack.queue, task="t.record", args=(
            str(stack.ledger), "fresh"), reply_to=replies, expires=now + 600))
        time.sleep(0.6)
        out = finish(stack.worker())
        kinds = {(e.message_id, e.kind) for e in events(broker, replies)}
        dead = broker.dead_letters(stack.queue)
    finally:
        broker.close()
    assert [d.reason.split(" (")[0] for d in dead] == [
        "expired: not started by its deadline"], dead
    assert "stale" not in stack.ledger.read_text(), out
    assert "done fresh" in stack.ledger.read_text(), out
    assert (stale.id, "expired") in kinds and (stale.id, "started") not in kinds, kinds


def test_a_killed_schedulers_claimed_attempt_is_published_by_another_within_seconds(
        stack: Stack, tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "stale.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('stale', retries=0)\n"
        f"dag.command('work', ['sh', '-c', 'echo ran >> {stack.ledger}'], "
        f"queue={stack.queue!r})\n")
    env = {**worker_env(stack.broker_url), "CONVEYOR_STATE_URL": stack.state_url,
           "CONVEYOR_DAGS_FOLDER": str(dags), "CONVEYOR_SCHEDULER_EVENT_LEASE": str(LEASE),
           "CONVEYOR_EVENTS_QUEUE": f"events-{stack.name}",
           "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{stack.name}",
           # idle, the survivor ticks only when told: it must not take the run itself
           "CONVEYOR_DAGS_RELOAD_INTERVAL": "0", "CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0",
           "CONVEYOR_LOG_LEVEL": "WARNING"}
    survivor = spawn("scheduler", env=env)
    store = from_url(stack.state_url)
    crashing: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: store.one("dag_row", dag_id="stale"), timeout=30,
                 what="the survivor to start")
        time.sleep(1.0)   # its first tick, just after it recorded the DAG, found nothing
        dag = load_folder(dags, ["queue"]).dags["stale"]
        run_id = trigger(store, dag, time.time(), executors=["queue"])
        crashing = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert crashing.wait(60) == -signal.SIGKILL
        killed_at = time.monotonic()
        [ti] = store.rows("run_tis", run_id=run_id)
        claimers = {row["scheduler_id"] for row in store.rows("schedulers")}
        assert ti["state"] == "queued" and ti["published_at"] is None, ti
        assert ti["claimed_by"] in claimers and len(claimers) == 2, (ti, claimers)
        wait_for(lambda: store.rows("run_tis", run_id=run_id)[0]["published_at"], timeout=60,
                 what="the survivor to publish the dead scheduler's claim")
        took = time.monotonic() - killed_at
        out = finish(stack.worker())
        wait_for(lambda: store.one("run", run_id=run_id)["state"] == "success", timeout=30,
                 what="the run to succeed")
    finally:
        store.close()
        for proc in (survivor, crashing):
            if proc is not None:
                stop(proc)
    print(f"claimed attempt published {took:.2f} s after its claimer's SIGKILL "
          f"(lease {LEASE:g} s)")
    assert took < LEASE + 10, f"published {took:.1f} s after the kill"  # room for load
    assert stack.ledger.read_text() == "ran\n", out


def test_a_task_requeued_by_a_stopping_worker_gets_its_time_to_start_again(
        stack: Stack, scheduler: Callable[[DAG], None]) -> None:
    """A worker draining past its drain timeout requeues the attempt it was running, past
    the attempt's first `expires`: the requeued message has a fresh one (as the scheduler's
    queued timer starts over on `interrupted`), so the next worker runs it."""
    dag = DAG("stale", retries=0)
    dag.command("work", gated(stack), queue=stack.queue, queued_timeout=5)
    dag.validate(["queue"])
    store = from_url(stack.state_url)
    try:
        first, first_log = consuming(stack, "--drain-timeout=1")
        scheduler(dag)   # published to a worker that waits for it: expires is not spent
        wait_for(lambda: stack.ledger.exists(), timeout=30, what="the task to start")
        seen = time.monotonic()
        # up before the requeue: the fresh expires (5 s) is not spent on its start-up
        second, second_log = consuming(stack)
        time.sleep(max(0.0, seen + 5.5 - time.monotonic()))  # the first expires is behind
        first.terminate()
        first_log.close(first)
        out = first_log.text()
        assert "killed and requeued" in out, out
        stack.ledger.with_name("go").touch()
        try:
            wait_for(lambda: the_task(store)["run_state"] != "running", timeout=60,
                     what="the run to end")
        finally:
            second.terminate()
            second_log.close(second)
            out += second_log.text()
        task, done = the_task(store), attempts(store)
    finally:
        store.close()
    assert (task["state"], task["attempt"]) == ("success", 1), (task, done, out)
    assert stack.ledger.read_text().split() == ["start", "start", "done"], out
    assert "expired" not in out


def test_a_running_attempt_whose_worker_was_killed_runs_again_past_its_expires(
        stack: Stack, scheduler: Callable[[DAG], None]) -> None:
    """The worker running the attempt is SIGKILLed after the attempt's `expires`: its
    message comes back (delivery 2) and is refused as expired, and the scheduler publishes
    the same attempt again with a fresh `expires`: it runs to the end, as a redelivery
    would have run it, instead of waiting for its heartbeat timeout (here 600 s)."""
    dag = DAG("stale", retries=0)
    dag.command("work", gated(stack), queue=stack.queue, queued_timeout=3,
                heartbeat_timeout=600)
    dag.validate(["queue"])
    store = from_url(stack.state_url)
    try:
        first, first_log = consuming(stack)
        scheduler(dag)   # published to a worker that waits for it: expires is not spent
        wait_for(lambda: stack.ledger.exists(), timeout=30, what="the task to start")
        seen = time.monotonic()
        # up before the kill: the fresh expires (3 s) is not spent on its start-up
        second, second_log = consuming(stack)
        time.sleep(max(0.0, seen + 3.5 - time.monotonic()))  # its expires is behind it
        first.kill()
        first_log.close(first)
        out = first_log.text()
        stack.ledger.with_name("go").touch()
        try:
            wait_for(lambda: the_task(store)["run_state"] != "running", timeout=60,
                     what="the run to end")
        finally:
            second.terminate()
            second_log.close(second)
            out += second_log.text()
        task = the_task(store)
    finally:
        store.close()
    assert (task["state"], task["attempt"]) == ("success", 1), (task, out)
    assert stack.ledger.read_text().split() == ["start", "start", "done"], out
    assert "expired" in out          # the redelivery of the first publish
