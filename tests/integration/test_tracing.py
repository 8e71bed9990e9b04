"""OpenTelemetry traces across real processes: a client, a worker (supervisor and runners),
a scheduler. Each process exports through tests/tracing_export.py (the SDK's
in-memory exporter, written through to a file), and the test reads the spans back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conveyor.tracing import run_ids
from tests.conftest import REDIS_URL, clean_transport, require_service
from tests.integration.workerkit import ROOT, finish, start_worker, worker_env
from tests.support import conveyor, spawn, stop
from tests.tracing_export import EXPORTER, read

pytestmark = pytest.mark.slow


@pytest.fixture
def q(unique: str) -> str:
    return f"otel-{unique}"


@pytest.fixture
def redis_url(unique: str) -> Iterator[str]:
    require_service("redis")
    yield f"{REDIS_URL}?prefix={unique}"
    clean_transport("redis", unique)


def traced_env(broker_url: str, spans: Path, **extra: str) -> dict[str, str]:
    return worker_env(broker_url, CONVEYOR_TRACING=EXPORTER, CONVEYOR_TEST_SPANS=str(spans),
                      **extra)


def enqueue_from_a_client_process(env: dict[str, str], *calls: str) -> None:
    """Enqueue with the default client (configured from the environment) in a process of its
    own; `calls` are `Message(...)` argument lists."""
    code = ("from conveyor.client import default_client\n"
            "from conveyor.message import Message\n"
            "client = default_client()\n"
            + "".join(f"client.enqueue(Message({call}))\n" for call in calls))
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = by_name(spans, name)
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {[s['name'] for s in spans]}"
    return found[0]


def test_enqueue_claim_run_outcome_are_one_trace_across_processes(
        redis_url: str, q: str, tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env = traced_env(redis_url, spans_file)
    enqueue_from_a_client_process(env, f"queue={q!r}, task='t.add', args=(2, 3)",
                                  f"queue={q!r}, task='t.fail', args=('bad',)")
    out = finish(start_worker(redis_url, q, "--concurrency=1", env=env))
    spans = read(spans_file)
    add = [s for s in spans if s["attributes"].get("conveyor.task") == "t.add"
           or s["name"].endswith(" t.add")]
    enqueue, claim = one(add, "enqueue t.add"), one(add, "claim t.add")
    run, outcome = one(add, "run t.add"), one(add, "outcome t.add")
    assert {s["trace"] for s in add} == {enqueue["trace"]}, add
    assert enqueue["parent"] == "" and enqueue["kind"] == "PRODUCER"
    assert claim["parent"] == enqueue["span"] and claim["kind"] == "CONSUMER"
    assert run["parent"] == claim["span"] and outcome["parent"] == claim["span"]
    # three processes: the client, the supervisor, and the runner that measured the run
    assert enqueue["service"] == "conveyor-client" and claim["service"] == "conveyor-worker"
    assert enqueue["pid"] != claim["pid"] and run["attributes"]["process.pid"] != claim["pid"]
    assert claim["start"] <= run["start"] <= run["end"] <= outcome["start"] <= claim["end"]
    assert run["status"] == "UNSET" and outcome["attributes"]["conveyor.action"] == "ack"

    # a failure retried once (t.fail: max_retries=1): both claims are children of its enqueue
    fail = [s for s in spans if s["name"].endswith(" t.fail")]
    claims, runs = by_name(fail, "claim t.fail"), by_name(fail, "run t.fail")
    assert len(claims) == 2 and len(runs) == 2, out
    assert {c["parent"] for c in claims} == {one(fail, "enqueue t.fail")["span"]}
    assert all(r["status"] == "ERROR" and "exception" in r["events"] for r in runs)
    assert sorted(c["attributes"]["conveyor.action"] for c in claims) == ["dead_letter", "retry"]


def test_a_follow_up_enqueued_by_a_task_is_a_child_of_its_run(redis_url: str, q: str,
                                                               tmp_path: Path) -> None:
    """The runner loads no SDK and holds no broker: its worker publishes the follow-up, and
    makes its `enqueue` span, under the `run` span of the task that asked (issue 27)."""
    spans_file = tmp_path / "spans.jsonl"
    env = traced_env(redis_url, spans_file)
    enqueue_from_a_client_process(env, f"queue={q!r}, task='t.follow_up', "
                                       f"args=(41, 1, {q + '-r'!r})")
    out = finish(start_worker(redis_url, q, "--concurrency=1", env=env))
    spans = read(spans_file)
    run = one(spans, "run t.follow_up")
    enqueue = one(spans, "enqueue t.add")
    assert (enqueue["trace"], enqueue["parent"]) == (run["trace"], run["span"]), out
    assert enqueue["service"] == "conveyor-worker" and enqueue["kind"] == "PRODUCER"
    assert run["start"] <= enqueue["start"] <= enqueue["end"] <= run["end"]
    claim = one(spans, "claim t.add")
    assert claim["parent"] == enqueue["span"]
    assert one(spans, "outcome t.add")["attributes"]["conveyor.outcome"] == "succeeded"


def test_a_dag_run_is_one_trace_with_its_task_instances_as_children(
        tmp_path: Path) -> None:
    spans_file, dags = tmp_path / "spans.jsonl", tmp_path / "dags"
    dags.mkdir()
    (dags / "traced.py").write_text(
        "from conveyor.scheduler import DAG\n"
        "dag = DAG('traced', retries=0)\n"
        "def step(name): return dag.command(name, ['true', name])\n"
        "step('a') >> [step('b'), step('c')]\n")
    env = traced_env(f"sqlite:///{tmp_path}/broker.db", spans_file,
                     CONVEYOR_STATE_URL=f"sqlite:///{tmp_path}/state.db",
                     CONVEYOR_DAGS_FOLDER=str(dags))
    procs = [spawn("worker", "--queues", "default", "--log-level", "WARNING", env=env),
             spawn("scheduler", "--log-level", "WARNING", env=env)]
    try:
        done = conveyor("dags", "trigger", "traced", "--wait", "--timeout", "60", "--json",
                        env=env)
    finally:
        codes = [stop(proc) for proc in procs]
    assert codes == [0, 0] and '"state": "success"' in done.stdout, done.stdout
    run_id = done.stdout.split('"run_id": "')[1].split('"')[0]
    spans = read(spans_file)
    root = one(spans, "dag_run traced")
    trace_id, span_id = run_ids(run_id)
    assert (root["trace"], root["span"], root["parent"]) == (f"{trace_id:032x}",
                                                             f"{span_id:016x}", "")
    assert {s["trace"] for s in spans} == {root["trace"]}, "one trace for the whole run"
    tasks = {name: one(spans, f"task traced.{name}") for name in "abc"}
    assert {t["parent"] for t in tasks.values()} == {root["span"]}
    for name, ti in tasks.items():   # each task's message, claimed and run by the worker
        enqueue = one([s for s in spans if s["parent"] == ti["span"]], f"enqueue true {name}")
        assert enqueue["service"] == "conveyor-scheduler"
        claim = one([s for s in spans if s["parent"] == enqueue["span"]], f"claim true {name}")
        assert claim["service"] == "conveyor-worker"
        assert {s["name"] for s in spans if s["parent"] == claim["span"]} == {
            f"run true {name}", f"outcome true {name}"}
    assert root["start"] <= tasks["a"]["start"] < tasks["a"]["end"] <= tasks["b"]["start"]
    assert max(t["end"] for t in tasks.values()) <= root["end"]


def test_with_tracing_off_nothing_of_opentelemetry_is_imported(q: str,
                                                                tmp_path: Path) -> None:
    """A worker and a client in one process, round trip done: no opentelemetry module, in
    it or in the runner that ran the task. On SQLite: redis-py 8 imports OpenTelemetry's
    metrics SDK by itself when it is installed (as it is here), whatever Conveyor does."""
    url = f"sqlite:///{tmp_path}/broker.db"
    code = (
        "import sys\n"
        "from conveyor import cli\n"
        "from conveyor.client import default_client\n"
        "from conveyor.message import Message\n"
        f"default_client().enqueue(Message(queue={q!r}, task='t.otel_loaded', "
        f"reply_to={q + '-r'!r}))\n"
        f"code = cli.main(['worker', '--queues={q}', '--app=tests.integration.worker_tasks', "
        "'--burst'])\n"
        "from conveyor.broker import from_url\n"
        "from tests.integration.workerkit import wait_event\n"
        f"event = wait_event(from_url({url!r}), {q + '-r'!r}, 'succeeded')\n"
        "print('runner', event.result)\n"
        "print('worker', any(m.startswith('opentelemetry') for m in sys.modules))\n"
        "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=worker_env(url),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["runner False", "worker False"], done.stdout


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that keeps the span names of every export request."""

    names: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        Collector.names += [span.name for resource in request.resource_spans
                            for scope in resource.scope_spans for span in scope.spans]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_otlp_exports_to_the_collector_and_exits_promptly_without_one(
        q: str, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"sqlite:///{tmp_path}/broker.db"
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        enqueue_from_a_client_process(worker_env(url, CONVEYOR_TRACING="otlp",
                                                 OTEL_EXPORTER_OTLP_ENDPOINT=endpoint),
                                      f"queue={q!r}, task='t.add', args=(1, 2)")
        assert Collector.names == ["enqueue t.add"]   # sent at exit, the batch not yet due
    finally:
        server.shutdown()
        server.server_close()
    started = time.monotonic()   # the same, no collector there: retries cut short at exit
    # (retrying for 60 s rather than the default 10: a process's start and exit on a loaded
    # machine take seconds, and the bound must stay far from both outcomes)
    enqueue_from_a_client_process(worker_env(url, CONVEYOR_TRACING="otlp",
                                             OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                                             OTEL_EXPORTER_OTLP_TIMEOUT="60"),
                                  f"queue={q!r}, task='t.add', args=(1, 2)")
    assert time.monotonic() - started < 30, "the exit waited out the exporter's 60 s retries"
