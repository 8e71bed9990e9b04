"""The kubernetes executor against a small in-test API server (no cluster, no Docker).

`FakeCluster` speaks the few core/v1 Pod endpoints the executor uses (create, list, watch as
a chunked stream, delete) over HTTP on 127.0.0.1, and plays the kubelet: a pod whose node
selector matches its one node runs its container command as a local process (exit 137 is
reported as OOMKilled); any other pod stays Pending, unschedulable, as on a full cluster.
The official `kubernetes` client is pointed at it.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from conveyor import broker as brokers
from conveyor.message import Message
from conveyor.scheduler import DAG
from conveyor.scheduler.config import SchedulerConfig
from conveyor.scheduler.daemon import Daemon
from conveyor.scheduler.engine import Engine
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Workload
from conveyor.scheduler.executors.kubernetes import KubernetesExecutor
from conveyor.scheduler.runs import create_run
from conveyor.state import store as stores
from tests.support import run_to_end

PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$")
NODE_LABELS = {"pool": "cpu"}
UNSCHEDULABLE = ("0/3 nodes are available: 3 node(s) didn't match Pod's node "
                 "affinity/selector.")


class FakeCluster:
    """Pods in memory, a resource version per change, watchers woken on each change."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.changes: list[tuple[int, str, dict[str, Any]]] = []
        self.version = 1
        self.cond = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def change(self, kind: str, pod: dict[str, Any]) -> None:
        with self.cond:
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
            self.changes.append((self.version, kind, json.loads(json.dumps(pod))))
            self.cond.notify_all()

    def create(self, pod: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = pod["metadata"]["name"]
        with self.cond:
            if name in self.pods:
                return 409, status(409, "AlreadyExists", f'pods "{name}" already exists')
            pod["metadata"]["creationTimestamp"] = datetime.now(UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ")
            pod["status"] = {"phase": "Pending"}
            if not schedulable(pod):
                # The scheduler's verdict comes with the pod, not from the kubelet thread:
                # creationTimestamp has whole seconds, so a pod a few ms old can already look
                # past a 1 s pending timeout, and the executor must find the reason then.
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                "reason": "Unschedulable",
                                                "message": UNSCHEDULABLE}]
            self.pods[name] = pod
            self.created.append(json.loads(json.dumps(pod)))
        self.change("ADDED", pod)
        threading.Thread(target=self.kubelet, args=(name,), daemon=True).start()
        return 201, pod

    def kubelet(self, name: str) -> None:
        pod = self.pods[name]
        if not schedulable(pod):
            return  # stays Pending, its condition set at creation
        pod["spec"]["nodeName"] = "node-1"
        pod["status"] = {"phase": "Running"}
        self.change("MODIFIED", pod)
        proc = subprocess.Popen(pod["spec"]["containers"][0]["command"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        code = proc.wait(60)
        reason = "Completed" if code == 0 else "OOMKilled" if code == 137 else "Error"
        pod["status"] = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
            {"name": "task", "ready": False, "restartCount": 0, "image": "i", "imageID": "",
             "state": {"terminated": {"exitCode": code, "reason": reason}}}]}
        if name in self.pods:
            self.change("MODIFIED", pod)

    def delete(self, name: str) -> tuple[int, dict[str, Any]]:
        with self.cond:
            pod = self.pods.pop(name, None)
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        self.change("DELETED", pod)
        return 200, pod

    def watch(self, since: int, timeout: float) -> Iterator[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                fresh = [c for c in self.changes if c[0] > since]
                if not fresh:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self.cond.wait(remaining)
                    continue
            for version, kind, pod in fresh:
                since = version
                yield json.dumps({"type": kind, "object": pod}).encode() + b"\n"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.reply(*cluster.create(body))

            def do_DELETE(self) -> None:
                match = PODS.match(urlsplit(self.path).path)
                assert match is not None
                self.reply(*cluster.delete(match["name"]))

            def do_GET(self) -> None:
                query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
                if query.get("watch") == "true":
                    self.stream(int(query.get("resourceVersion") or 0),
                                float(query.get("timeoutSeconds", 5)))
                    return
                with cluster.cond:
                    items = list(cluster.pods.values())
                    version = cluster.version
                self.reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items,
                                 "metadata": {"resourceVersion": str(version)}})

            def reply(self, code: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def stream(self, since: int, timeout: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in cluster.watch(since, timeout):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def schedulable(pod: dict[str, Any]) -> bool:
    """Whether a node matches the pod's nodeSelector."""
    selector = pod["spec"].get("nodeSelector") or {}
    return all(NODE_LABELS.get(k) == v for k, v in selector.items())


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster()
    fake.thread.start()
    yield fake
    fake.close()


def kube_api(cluster: FakeCluster) -> Any:
    config = client.Configuration()
    config.host = cluster.url
    return client.CoreV1Api(client.ApiClient(config))


def run_dag(dag: DAG, executor: KubernetesExecutor, tmp_path: Path) -> dict[str, Any]:
    """Run one run of `dag` on the kubernetes executor to its end; its tasks and attempts."""
    dag.validate(["kubernetes"])
    config = SchedulerConfig.from_env({}, broker_url=f"sqlite:///{tmp_path}/broker.db",
                                      state_url=f"sqlite:///{tmp_path}/state.db")
    store = stores.from_url(config.settings.state_url)
    engine = Engine(store, {"kubernetes": executor}, dags={dag.dag_id: dag})
    daemon = Daemon(engine, brokers.from_url(config.settings.broker_url),
                    {"kubernetes": executor}, events_queue=config.events_queue,
                    control_queue=config.control_queue)
    run_id = create_run(store, dag, time.time(), executors=["kubernetes"])
    try:
        run_to_end(daemon)
        return {"run": store.one("run", run_id=run_id),
                "tasks": {t["task_id"]: t for t in store.rows("run_tis", run_id=run_id)},
                "attempts": store.rows("run_attempts", run_id=run_id)}
    finally:
        daemon.close()


def test_one_pod_per_attempt_watched_to_completion(cluster: FakeCluster, tmp_path: Path) -> None:
    executor = KubernetesExecutor(kube_api(cluster), namespace="jobs", image="python:3.11",
                                  resync=1.0)
    dag = DAG("pods", executor="kubernetes")
    ok = dag.command("ok", ["sh", "-c", "exit 0"], memory_limit="256MiB", time_limit=30,
                     executor_config={"node_selector": {"pool": "cpu"},
                                      "requests": {"cpu": "250m"}})
    bad = dag.command("bad", ["sh", "-c", "exit 3"], retries=1, retry_delay=0)
    ok >> bad
    done = run_dag(dag, executor, tmp_path)

    assert done["run"]["state"] == "failed"
    assert (done["tasks"]["ok"]["state"], done["tasks"]["ok"]["hostname"]) == ("success", "node-1")
    assert (done["tasks"]["bad"]["state"], done["tasks"]["bad"]["attempt"]) == ("failed", 2)
    assert "container task exited with code 3 (Error)" in done["tasks"]["bad"]["error"]
    first = cluster.created[0]
    assert first["metadata"]["name"] == f"conveyor-{done['tasks']['ok']['ti_id'].lower()}-1"
    assert first["spec"]["restartPolicy"] == "Never"
    assert first["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert first["spec"]["activeDeadlineSeconds"] == 30
    container = first["spec"]["containers"][0]
    assert container["image"] == "python:3.11"
    assert container["resources"] == {"requests": {"cpu": "250m"},
                                      "limits": {"memory": str(256 * 1024 * 1024)}}
    assert [p["metadata"]["name"][-1] for p in cluster.created] == ["1", "1", "2"]
    assert cluster.pods == {}   # finished pods are deleted


def test_pending_past_its_timeout_fails_with_the_clusters_reason(cluster: FakeCluster,
                                                                 tmp_path: Path) -> None:
    executor = KubernetesExecutor(kube_api(cluster), image="trainer:1", pending_timeout=1.0,
                                  resync=0.5)
    dag = DAG("gpu")
    dag.command("train", ["sh", "-c", "exit 0"], executor="kubernetes",
                executor_config={"node_selector": {"pool": "gpu"}})
    started = time.monotonic()
    done = run_dag(dag, executor, tmp_path)
    assert time.monotonic() - started < 10
    error = done["tasks"]["train"]["error"]
    assert done["tasks"]["train"]["state"] == "failed"
    assert "was Pending for more than 1 s: not scheduled (Unschedulable): 0/3 nodes" in error
    assert cluster.pods == {}


def test_a_pod_whose_attempt_timed_out_is_withdrawn(cluster: FakeCluster,
                                                    tmp_path: Path) -> None:
    """A pod reads no `expires`: the scheduler deletes the Pending pod of an attempt it
    timed out for not starting, so it can never start later."""
    executor = KubernetesExecutor(kube_api(cluster), image="trainer:1", pending_timeout=300,
                                  resync=0.5)
    dag = DAG("gpu")
    dag.command("train", ["sh", "-c", "exit 0"], executor="kubernetes", queued_timeout=1,
                executor_config={"node_selector": {"pool": "gpu"}})
    done = run_dag(dag, executor, tmp_path)
    assert done["tasks"]["train"]["state"] == "failed"
    assert [a["outcome"] for a in done["attempts"]] == ["queued_timeout"]
    assert len(cluster.created) == 1 and cluster.pods == {}


def test_oom_killed_pods_report_their_memory_limit(cluster: FakeCluster,
                                                   tmp_path: Path) -> None:
    executor = KubernetesExecutor(kube_api(cluster), image="i", resync=1.0)
    dag = DAG("oom")
    dag.command("hog", ["sh", "-c", "exit 137"], executor="kubernetes", memory_limit="1GiB")
    done = run_dag(dag, executor, tmp_path)
    assert done["attempts"][0]["outcome"] == "oom_killed"
    assert "was OOM-killed (memory limit 1073741824)" in done["tasks"]["hog"]["error"]


def test_a_pod_exiting_with_a_skip_code_is_skipped_not_retried(cluster: FakeCluster,
                                                                tmp_path: Path) -> None:
    executor = KubernetesExecutor(kube_api(cluster), image="i", resync=1.0)
    dag = DAG("skips", executor="kubernetes")
    check = dag.command("check", ["sh", "-c", "exit 99"], retries=2, retry_delay=0)
    check >> dag.command("load", ["sh", "-c", "exit 0"])
    done = run_dag(dag, executor, tmp_path)
    check_ti = done["tasks"]["check"]
    assert (check_ti["state"], check_ti["attempt"]) == ("skipped", 1)
    assert "exited with code 99 (skip_on_exit_code)" in check_ti["error"]
    assert done["tasks"]["load"]["state"] == "skipped"
    assert done["run"]["state"] == "success" and len(cluster.created) == 1


def test_a_redone_publish_finds_the_pod_already_there(cluster: FakeCluster) -> None:
    executor = KubernetesExecutor(kube_api(cluster), image="i")
    work = Workload(Message(queue="q", command=("sleep", "0.1"), attempt=2,
                            headers={"ti": "01ABC", "attempt": "2"}))
    executor.submit(work)
    executor.submit(work)            # the scheduler died before recording the publish
    assert list(cluster.pods) == ["conveyor-01abc-2"] and len(cluster.created) == 1


def test_refused_pods_and_missing_commands_fail_the_attempt_clearly(
        cluster: FakeCluster) -> None:
    executor = KubernetesExecutor(kube_api(cluster), image="")
    with pytest.raises(ExecutorError, match="has no image: set executor_config"):
        executor.submit(Workload(Message(queue="q", command=("true",))))
    with pytest.raises(ExecutorError, match="has no container command"):
        executor.submit(Workload(Message(queue="q", task="billing.load"), {"image": "i"}))
