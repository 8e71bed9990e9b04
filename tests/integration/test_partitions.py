"""Partitions (issue 31): worker hosts in network namespaces of their own, links cut, healed
and slowed while everything runs (tests/integration/netns.py), on a Redis and a Postgres of
the module's own listening on an address private to it.

Each case asserts what the README ("What each broker guarantees under a partition") says:
nothing lost, every duplicate explained (a run the partition interrupted or whose ack it held
back), no two runs of one task overlapping in time, and prints how long recovery took. The
task (`t.runlog`) appends its start, a tick every 50 ms and its end to a ledger file every
namespace shares, on CLOCK_MONOTONIC, which they share too.

Leases are short here: `--heartbeat-interval=1` gives a 3 s lease, so a self-fencing worker
stops its runner 2.5 s after its last renewal (worker/fencing.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.message import Message
from conveyor.results.handle import ResultHandle
from conveyor.state.store import from_url as from_state_url
from tests.conftest import RABBITMQ_URL, clean_transport, require_service
from tests.integration import netns
from tests.integration.private_servers import postgres_server, redis_server
from tests.integration.workerkit import APP, ROOT, events, finish, worker_env
from tests.support import wait_for

WHY_NOT = netns.missing()
pytestmark = [
    pytest.mark.partition, pytest.mark.xdist_group("partition"),
    pytest.mark.skipif(bool(WHY_NOT) and os.environ.get("CI") != "true",
                       reason=f"partition tests: {WHY_NOT}"),
]
BROKERS = ("redis", "postgres")


@dataclass
class Servers:
    net: netns.Network
    urls: dict[str, str]      # broker -> base URL at the private address
    hosts: list[netns.Host]   # two worker hosts, reused by every test (healed after each)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if WHY_NOT:
        raise AssertionError(f"partition tests must run in CI: {WHY_NOT}")
    net = netns.Network()
    try:
        with redis_server(tmp_path_factory.mktemp("redis"), (net.server, "127.0.0.1")) as redis, \
                postgres_server((net.server, "127.0.0.1"), trusted=str(net.subnet)) as pg:
            yield Servers(net, {"redis": redis.url, "postgres": pg.url},
                          [net.host(), net.host()])
    finally:
        net.close()


@dataclass
class Case:
    """One test's broker URL, queue and ledger, and the workers it started (killed after)."""

    servers: Servers
    url: str
    queue: str
    ledger: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def worker(self, host: netns.Host | None, *flags: str, url: str = "") -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "conveyor.cli", "worker", f"--queues={self.queue}",
                f"--app={APP}", "--heartbeat-interval=1", *flags]
        proc = subprocess.Popen(host.command(argv) if host else argv, cwd=ROOT,
                                env=worker_env(url or self.url), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def client(self) -> Client:
        """A client on this case's broker, whose results are the workers' result store."""
        return Client(from_url(self.url), settings=Settings.from_env(worker_env(self.url)))

    def enqueue(self, client: Client, tag: str, seconds: float) -> ResultHandle:
        return client.enqueue(Message(queue=self.queue, task="t.runlog",
                                      args=(str(self.ledger), tag, seconds)), keep_result=True)


@pytest.fixture(params=BROKERS)
def case(request: pytest.FixtureRequest, servers: Servers, tmp_path: Path,
         unique: str) -> Iterator[Case]:
    base = servers.urls[request.param]
    sep = "&" if "?" in base else "?"
    option = f"prefix={unique}" if request.param == "redis" else f"schema={unique}"
    made = Case(servers, f"{base}{sep}{option}&retry_seconds=5", f"q-{unique}",
                tmp_path / "ledger")
    made.ledger.touch(mode=0o666)
    yield made
    for host in servers.hosts:
        for undo in (host.heal, host.unslow):
            try:
                undo()
            except RuntimeError:
                pass   # it was not cut (or slowed)
    for proc in made.procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        if proc.stdout is not None:
            name = f"reading {proc.pid}"
            wait_for(lambda: not any(t.is_alive() and t.name == name   # noqa: B023
                                     for t in threading.enumerate()), 10,
                     "the worker's output read to its end")
            proc.stdout.close()



@dataclass
class RunOf:
    """One run of one task as the ledger shows it: from its start to its end, or to its
    last tick if it was killed."""

    tag: str
    pid: int
    start: float
    last: float
    ended: bool


def runs(ledger: Path) -> dict[str, list[RunOf]]:
    """Each task's runs, in the order they started."""
    found: dict[tuple[str, int], RunOf] = {}
    for line in ledger.read_text().splitlines():
        kind, tag, pid, at = line.split()
        key = (tag, int(pid))
        if kind == "start":
            found[key] = RunOf(tag, int(pid), float(at), float(at), False)
        else:
            found[key].last = float(at)
            found[key].ended = kind == "end"
    by_tag: dict[str, list[RunOf]] = {}
    for run in sorted(found.values(), key=lambda r: r.start):
        by_tag.setdefault(run.tag, []).append(run)
    return by_tag


def assert_no_overlap(by_tag: dict[str, list[RunOf]]) -> None:
    for tag, tag_runs in by_tag.items():
        for before, after in zip(tag_runs, tag_runs[1:], strict=False):
            assert before.last < after.start, (
                f"two runs of {tag} overlapped: pid {before.pid} ran until {before.last:.3f}, "
                f"pid {after.pid} started at {after.start:.3f}")


def test_a_cut_off_worker_is_fenced_and_its_task_runs_once_more_elsewhere(case: Case) -> None:
    """Self-fencing (cases a and b): worker A runs a 4 s task and is cut off from the
    broker. It cannot renew the lease, so 2.5 s after its last renewal it kills its runner
    itself; once the lease lapses (3 s) worker B, on another host, runs the task from the
    start to its end. When the link heals A's settle (a requeue) is refused: the message is
    B's now. One duplicate, explained: the run the partition interrupted; no overlap."""
    host_a, host_b = case.servers.hosts
    client = case.client()
    try:
        handle = case.enqueue(client, "long", 4.0)
        a = case.worker(host_a)
        wait_for(lambda: "long" in runs(case.ledger), 60, "A to start the task")
        host_a.cut()
        cut_at = time.monotonic()
        b = case.worker(host_b, "--burst")
        wait_for(lambda: len(runs(case.ledger)["long"]) == 2, 60, "B to run the task again")
        recovered = runs(case.ledger)["long"][1].start - cut_at
        out_b = finish(b, 60)
        host_a.heal()
        assert handle.result(timeout=30) == runs(case.ledger)["long"][1].pid
        a.terminate()
        out_a = finish(a, 90)
    finally:
        client.close()
    first, second = runs(case.ledger)["long"]
    print(f"\n{case.url.split(':')[0]}: fenced after {first.last - cut_at:.2f} s of partition; "
          f"task running again elsewhere {recovered:.2f} s after the cut (lease 3 s)")
    assert "self-fenced" in out_a, out_a
    assert not first.ended and second.ended, (first, second, out_a, out_b)
    assert_no_overlap(runs(case.ledger))


def reading(proc: subprocess.Popen[str]) -> list[str]:
    """The lines `proc` prints, collected by a thread as they come; the thread ends with
    the process (`Case` closes its output after it)."""
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.extend(stdout), name=f"reading {proc.pid}",
                     daemon=True).start()
    return lines


def test_a_stale_workers_late_ack_result_and_event_are_refused(case: Case) -> None:
    """Case a: worker A finishes a 0.5 s task while cut off, so it cannot report or ack; the
    lease lapses and worker B runs the task again and stores its result. When the link
    heals, A's late result is refused (the result store keeps the first write: B's), its
    ack is refused (LeaseLost: the lease token is B's) and its late `succeeded` event names
    delivery 1, which a reader tells from B's delivery 2. One duplicate, explained: the run
    whose ack the partition held back; the two runs do not overlap."""
    host_a, host_b = case.servers.hosts
    client = case.client()
    events_queue = f"ev-{case.queue}"
    try:
        handle = client.enqueue(Message(queue=case.queue, task="t.runlog", reply_to=events_queue,
                                        args=(str(case.ledger), "short", 0.5)),
                                keep_result=True)
        a = case.worker(host_a)
        out_a = reading(a)
        wait_for(lambda: "short" in runs(case.ledger), 60, "A to start the task",
                 detail=lambda: "".join(out_a))
        host_a.cut()
        cut_at = time.monotonic()
        wait_for(lambda: runs(case.ledger)["short"][0].ended, 30, "A's run to end, cut off")
        b = case.worker(host_b, "--burst")
        assert handle.result(timeout=60) == runs(case.ledger)["short"][1].pid
        recovered = time.monotonic() - cut_at
        out_b = finish(b, 60)
        host_a.heal()
        healed_at = time.monotonic()
        wait_for(lambda: "no longer ours" in "".join(out_a), 90,
                 "A's late ack to be refused", detail=lambda: "".join(out_a))
        settled = time.monotonic() - healed_at
        told = [e for e in events(client.broker, events_queue) if e.kind == "succeeded"]  # type: ignore[arg-type]
        assert handle.result(timeout=5) == runs(case.ledger)["short"][1].pid, "overridden"
        a.terminate()
        a.wait(60)
    finally:
        client.close()
    first, second = runs(case.ledger)["short"]
    print(f"\n{case.url.split(':')[0]}: result stored by another worker {recovered:.2f} s "
          f"after the cut; the stale worker's late ack refused {settled:.2f} s after the heal")
    assert first.ended and second.ended, (first, second)
    assert_no_overlap(runs(case.ledger))
    assert sorted(e.delivery for e in told) == [1, 2], (told, out_b)
    assert {e.pid for e in told if e.delivery == 2} == {second.pid}


def test_a_slow_lossy_link_loses_nothing(case: Case) -> None:
    """Case d: a worker whose link to the broker drops 5% of packets each way and adds
    100 ms each way runs 4 short tasks: every one ends, none runs twice (the lease is
    renewed in time over the slow link; a self-fenced run would say so and be counted)."""
    host_a = case.servers.hosts[0]
    parts = urlsplit(case.url)
    assert parts.hostname is not None and parts.port is not None
    relay = netns.DelayRelay(case.servers.net.server, (parts.hostname, parts.port))
    relay.delay = host_a.slow()
    slow_url = case.url.replace(f"{parts.hostname}:{parts.port}", relay.address)
    client = case.client()
    try:
        handles = [case.enqueue(client, f"s{n}", 0.1) for n in range(4)]
        began = time.monotonic()
        a = case.worker(host_a, "--burst", "--concurrency=2", url=slow_url)
        out_a = finish(a, 120)
        took = time.monotonic() - began
        results = [h.result(timeout=30) for h in handles]
    finally:
        client.close()
        relay.close()
    by_tag = runs(case.ledger)
    fenced = out_a.count("self-fenced")
    unstarted = out_a.count("not started: its lease could not be renewed")
    print(f"\n{case.url.split(':')[0]}: 4 tasks over a slow link ({host_a.slowed_by}) in "
          f"{took:.1f} s; {fenced} run(s) self-fenced, {unstarted} claimed one(s) given back "
          "unstarted as their lease lapsed")
    assert sorted(by_tag) == sorted(f"s{n}" for n in range(4)), out_a
    assert all(r[-1].ended for r in by_tag.values()), out_a
    assert sum(len(r) - 1 for r in by_tag.values()) == fenced, out_a
    assert all(isinstance(r, int) for r in results)
    assert_no_overlap(by_tag)


CHAIN = ("t1", "t2", "t3", "t4")
CUT = 4.0   # seconds the scheduler is cut off from its state store


def chain_dag(folder: Path, queue: str, ledger: Path) -> None:
    """A DAG `chain`: four command tasks one after another, each writing its start and end
    (with its wall-clock time) to `ledger`, 1 s apart."""
    folder.mkdir()
    lines = ["from conveyor.scheduler import DAG", "dag = DAG('chain', retries=0)"]
    lines += [f"{task} = dag.command({task!r}, ['sh', '-c', 'echo start {task} $(date +%s.%N) "
              f">> {ledger}; sleep 1; echo end {task} $(date +%s.%N) >> {ledger}'], "
              f"queue={queue!r})" for task in CHAIN]
    (folder / "chain.py").write_text("\n".join([*lines, " >> ".join(CHAIN)]) + "\n")


def ledger_lines(ledger: Path) -> list[tuple[str, str]]:
    return [(kind, task) for kind, task, _ in
            (line.split() for line in ledger.read_text().splitlines())]


def ledger_times(ledger: Path) -> dict[tuple[str, str], float]:
    return {(kind, task): float(at) for kind, task, at in
            (line.split() for line in ledger.read_text().splitlines())}


def test_a_scheduler_cut_off_from_its_state_store_stops_then_resumes_once(
        servers: Servers, tmp_path: Path, unique: str) -> None:
    """Case c: the scheduler (on host A) loses its state store (Postgres) for CUT s while t2
    of a four-task chain runs; the broker and the worker stay reachable. t2 ends and its event
    waits in the events queue: no transition can be recorded, so t3 is not dispatched while
    the store is away. When the link heals the scheduler applies the event and the chain
    goes on: every task ran once, the run succeeded, the scheduler never stopped."""
    host_a = servers.hosts[0]
    pg_port = urlsplit(servers.urls["postgres"]).port
    assert pg_port is not None
    ledger, dags = tmp_path / "ledger", tmp_path / "dags"
    ledger.touch(mode=0o666)
    queue, broker_url = f"q-{unique}", f"{servers.urls['redis']}?prefix={unique}"
    state_url = f"{servers.urls['postgres']}?schema={unique}s"
    chain_dag(dags, queue, ledger)
    env = {**worker_env(broker_url), "CONVEYOR_STATE_URL": state_url,
           "CONVEYOR_DAGS_FOLDER": str(dags), "CONVEYOR_SCHEDULER_EVENT_LEASE": "2",
           "CONVEYOR_EVENTS_QUEUE": f"events-{unique}",
           "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{unique}",
           "CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0"}
    started: list[subprocess.Popen[str]] = []

    def spawn(argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        started.append(proc)
        return proc

    conveyor = [sys.executable, "-m", "conveyor.cli"]
    scheduler = spawn(host_a.command([*conveyor, "scheduler"]))
    out = reading(scheduler)
    store = from_state_url(state_url)
    try:
        spawn([*conveyor, "worker", f"--queues={queue}", "--heartbeat-interval=1"])
        wait_for(lambda: store.one("dag_row", dag_id="chain"), 60, "the DAG recorded",
                 detail=lambda: "".join(out))
        subprocess.run([*conveyor, "dags", "trigger", "chain"], env=env, check=True,
                       capture_output=True, timeout=60)
        wait_for(lambda: ("start", "t2") in ledger_lines(ledger), 60, "t2 to start")
        host_a.cut(pg_port)
        cut_at, cut_wall = time.monotonic(), time.time()
        wait_for(lambda: ("end", "t2") in ledger_lines(ledger), 30, "t2 to end")
        time.sleep(max(0.0, cut_at + CUT - time.monotonic()))  # the store away for CUT s
        host_a.heal()
        healed_at, healed_wall = time.monotonic(), time.time()
        wait_for(lambda: ("start", "t3") in ledger_lines(ledger), 60, "t3 to start",
                 detail=lambda: "".join(out))
        resumed = time.monotonic() - healed_at
        wait_for(lambda: store.rows("recent_runs", dag_id="chain", state="", limit=1)[0][
            "state"] == "success", 60, "the run to succeed", detail=lambda: "".join(out))
        alive = scheduler.poll() is None
    finally:
        store.close()
        for proc in started:
            proc.terminate()
        for proc in started:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                if proc is scheduler:   # its reading thread ends with the process's output
                    wait_for(lambda: not any(t.name == f"reading {scheduler.pid}"
                                             for t in threading.enumerate()), 10, "EOF")
                proc.stdout.close()
    print(f"\nscheduler cut off from its state store for {CUT:g} s: nothing dispatched meanwhile; "
          f"the chain went on {resumed:.2f} s after the heal")
    assert alive, "".join(out)
    at = ledger_times(ledger)
    assert at["end", "t2"] > cut_wall, "t2 ended before the cut: the machine was too slow"
    for before, after in zip(CHAIN, CHAIN[1:], strict=False):   # nothing moved while cut off
        if at["end", before] > cut_wall:
            assert at["start", after] > healed_wall, (before, after, at, "".join(out))
    lines = ledger_lines(ledger)
    assert sorted(lines) == sorted((kind, task) for task in CHAIN
                                   for kind in ("start", "end")), lines


def test_on_rabbitmq_a_cut_off_worker_is_fenced_before_its_task_runs_again(
        servers: Servers, tmp_path: Path, unique: str) -> None:
    """RabbitMQ (the shared node, reached through a relay on the test's address): deliveries
    belong to a connection, not a lease. Worker A is cut off 0.1 s into an 8 s task; the
    broker misses A's heartbeats (`heartbeat=2`), closes its connection no sooner than 4 s
    after it last read from it and hands the task to worker B. A reckons that lease from round
    trips on the connection (broker/rabbitmq/liveness.py) and kills its runner before it
    lapses (self-fencing): the two runs do not overlap. A's requeue, made on the connection
    the broker closed, is never taken (it is not delivered a third time) and nothing is lost:
    one duplicate, the run the partition interrupted."""
    require_service("rabbitmq")
    relay = netns.DelayRelay(servers.net.server, ("127.0.0.1", 5672))
    url = f"amqp://guest:guest@{relay.address}/%2F?heartbeat=2"
    ledger, queue = tmp_path / "ledger", f"q-{unique}"
    ledger.touch(mode=0o666)
    case = Case(servers, url, queue, ledger)
    host_a, host_b = servers.hosts
    client = Client(from_url(RABBITMQ_URL))
    try:
        client.enqueue(Message(queue=queue, task="t.runlog", args=(str(ledger), "long", 8.0)))
        a = case.worker(host_a)
        out_a = reading(a)
        wait_for(lambda: "long" in runs(ledger), 60, "A to start the task",
                 detail=lambda: "".join(out_a))
        host_a.cut()
        cut_at = time.monotonic()
        b = case.worker(host_b)   # not --burst: the message is A's until the broker sees A gone
        out_b = reading(b)
        wait_for(lambda: len(runs(ledger)["long"]) == 2, 60, "B to run the task again",
                 detail=lambda: "".join(out_b))
        recovered = runs(ledger)["long"][1].start - cut_at
        wait_for(lambda: runs(ledger)["long"][1].ended, 30, "B's run to end")
        host_a.heal()
        wait_for(lambda: "self-fenced" in "".join(out_a), 30, "A to fence its run",
                 detail=lambda: "".join(out_a))
        wait_for(lambda: "reconnected to RabbitMQ" in "".join(out_a), 60,
                 "A to reach the broker again (its late ack, if any, sent before)",
                 detail=lambda: "".join(out_a))
        a.terminate()
        a.wait(60)
    finally:
        client.close()
        for proc in case.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            if proc.stdout is not None:
                name = f"reading {proc.pid}"
                wait_for(lambda: not any(t.name == name   # noqa: B023
                                         for t in threading.enumerate()), 10, "EOF")
                proc.stdout.close()
        for host in servers.hosts:
            with contextlib.suppress(RuntimeError):
                host.heal()
        relay.close()
        clean_transport("rabbitmq", unique)
    first, second = runs(ledger)["long"]
    print(f"\nrabbitmq: the cut-off worker killed its runner {first.last - cut_at:.2f} s after "
          f"the cut (last tick); the task ran again elsewhere {recovered:.2f} s after the cut "
          f"(heartbeat 2 s); no overlap")
    assert not first.ended and second.ended, ("".join(out_a), "".join(out_b))
    assert_no_overlap(runs(ledger))
    depth = from_url(RABBITMQ_URL)
    try:
        assert depth.is_empty([queue]), "the message came back once more: A's ack was taken?"
    finally:
        depth.close()


def test_a_fenced_dag_attempts_late_events_change_nothing_the_newer_run_recorded(
        servers: Servers, tmp_path: Path, unique: str) -> None:
    """Case a for a DAG task: worker A runs attempt 1 of a 4 s command task and is cut off;
    it fences itself, the lease lapses, worker B runs the same attempt (delivery 2) to its
    end and the scheduler records the success. When A's link heals, its late `interrupted`
    event (delivery 1) and its refused requeue change nothing: the task stays a success of
    attempt 1, recorded once, the run succeeded; the two runs did not overlap."""
    host_a, host_b = servers.hosts
    ledger, dags = tmp_path / "ledger", tmp_path / "dags"
    ledger.touch(mode=0o666)
    queue, broker_url = f"q-{unique}", f"{servers.urls['redis']}?prefix={unique}"
    state_url = f"{servers.urls['postgres']}?schema={unique}s"
    dags.mkdir()
    ticking = (f"echo start w $$ $(date +%s.%N) >> {ledger}; for i in $(seq 40); do sleep 0.1; "
               f"echo tick w $$ $(date +%s.%N) >> {ledger}; done; "
               f"echo end w $$ $(date +%s.%N) >> {ledger}")
    (dags / "one.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('one', retries=0)\n"
        f"dag.command('w', ['sh', '-c', {ticking!r}], queue={queue!r})\n")
    events_queue = f"events-{unique}"
    env = {**worker_env(broker_url), "CONVEYOR_STATE_URL": state_url,
           "CONVEYOR_DAGS_FOLDER": str(dags), "CONVEYOR_EVENTS_QUEUE": events_queue,
           "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{unique}",
           "CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0"}
    case = Case(servers, broker_url, queue, ledger)
    conveyor = [sys.executable, "-m", "conveyor.cli"]
    scheduler = subprocess.Popen([*conveyor, "scheduler"], cwd=ROOT, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    case.procs.append(scheduler)
    out_s = reading(scheduler)
    store = from_state_url(state_url)
    broker = from_url(broker_url)
    try:
        wait_for(lambda: store.one("dag_row", dag_id="one"), 60, "the DAG recorded",
                 detail=lambda: "".join(out_s))
        a = case.worker(host_a)
        out_a = reading(a)
        subprocess.run([*conveyor, "dags", "trigger", "one"], env=env, check=True,
                       capture_output=True, timeout=60)
        wait_for(lambda: "w" in runs(ledger), 60, "A to start the task")
        host_a.cut()
        cut_at = time.monotonic()
        b = case.worker(host_b)
        out_b = reading(b)

        def run() -> dict[str, object]:
            return store.rows("recent_runs", dag_id="one", state="", limit=1)[0]

        wait_for(lambda: run()["state"] == "success", 60, "B to run the attempt to success",
                 detail=lambda: "".join(out_b) + "".join(out_s))
        recovered = time.monotonic() - cut_at
        host_a.heal()
        wait_for(lambda: "no longer ours" in "".join(out_a), 60, "A's late requeue refused",
                 detail=lambda: "".join(out_a))
        wait_for(lambda: broker.depth(events_queue).active == 0, 30,
                 "the scheduler to take A's late events")
        [ti] = store.rows("run_tis", run_id=run()["run_id"])
        attempts = store.rows("run_attempts", run_id=run()["run_id"])
        final = run()["state"]
    finally:
        store.close()
        broker.close()
        for proc in case.procs:
            proc.terminate()
        for proc in case.procs:
            proc.wait(60)
            if proc.stdout is not None:
                name = f"reading {proc.pid}"
                wait_for(lambda: not any(t.name == name   # noqa: B023
                                         for t in threading.enumerate()), 10, "EOF")
                proc.stdout.close()
        with contextlib.suppress(RuntimeError):
            host_a.heal()
    first, second = runs(ledger)["w"]
    print(f"\nDAG attempt: fenced on the cut-off worker, succeeded on another "
          f"{recovered:.2f} s after the cut; the late events changed nothing")
    assert "self-fenced" in "".join(out_a)
    assert (ti["state"], ti["attempt"], final) == ("success", 1, "success"), ti
    assert [(x["attempt"], x["outcome"]) for x in attempts] == [(1, "succeeded")], attempts
    assert not first.ended and second.ended, (first, second)
    assert_no_overlap(runs(ledger))
