"""The Kubernetes target against an in-test API server, with the official client.

The server speaks the real endpoints the autoscaler's Role allows: apps/v1
deployments/{name}/scale GET and PATCH, core/v1 pods list and PATCH. The client finds it
through a kubeconfig file, as it would a cluster. Worker pods' /metrics are small servers
on 127.0.0.x, one loopback address per pod, all on the same port as in a cluster.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest

from conveyor import limits
from conveyor.autoscaler import config as configs
from conveyor.autoscaler import daemon as daemons
from conveyor.autoscaler.daemon import Daemon
from conveyor.autoscaler.metrics import AutoscalerMetrics
from conveyor.broker import Broker, Depth, Publication, from_url
from conveyor.broker.sqlite import SQLiteBroker
from conveyor.errors import BrokerConnectionError
from conveyor.flow import limits_of
from conveyor.limits import Override, Parcel
from conveyor.locations import store_urls
from conveyor.message import Codec
from tests import flow_tasks
from tests.support import free_port

NS = "conveyor"
COST = "controller.kubernetes.io/pod-deletion-cost"
SELECTOR = "app=conveyor-worker,queue=default"
MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


@dataclass
class Cluster:
    """What the fake API server holds and what it was asked."""

    replicas: dict[str, int] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    fail_with: int = 0  # answer every request with this status (0: answer normally)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def patches(self, kind: str) -> list[Any]:
        return [body for method, path, body in self.requests
                if method == "PATCH" and kind in path]


def scale_json(name: str, replicas: int) -> dict[str, Any]:
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas,
                                                      "selector": SELECTOR}}


def pod_json(name: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": NS, "labels": pod["labels"],
                         "annotations": pod["annotations"]},
            "status": {"phase": "Running", "podIP": pod["ip"]}}


def matches(labels: dict[str, str], selector: str) -> bool:
    return all(labels.get(k) == v for k, v in (term.split("=") for term in selector.split(",")))


class FakeAPI(BaseHTTPRequestHandler):
    cluster: Cluster

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET", None)

    def do_PATCH(self) -> None:  # noqa: N802
        assert self.headers["Content-Type"] in MERGE_TYPES, self.headers["Content-Type"]
        assert self.headers["Authorization"] == "Bearer t0ken"
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._serve("PATCH", body)

    def _serve(self, method: str, body: Any) -> None:
        path, _, query = self.path.partition("?")
        with self.cluster.lock:
            self.cluster.requests.append((method, path, body))
            if self.cluster.fail_with:
                return self._send(self.cluster.fail_with, {"kind": "Status", "code":
                                                           self.cluster.fail_with})
            self._route(method, path.strip("/").split("/"), query, body)

    def _route(self, method: str, parts: list[str], query: str, body: Any) -> None:
        c = self.cluster
        if parts[:5] == ["apis", "apps", "v1", "namespaces", NS] and parts[-1] == "scale":
            name = parts[6]
            if name not in c.replicas:
                return self._send(404, {"kind": "Status", "code": 404})
            if method == "PATCH":
                c.replicas[name] = body["spec"]["replicas"]
            return self._send(200, scale_json(name, c.replicas[name]))
        if parts[:5] == ["api", "v1", "namespaces", NS, "pods"] and method == "GET":
            selector = dict(p.split("=", 1) for p in query.split("&"))["labelSelector"]
            selector = selector.replace("%3D", "=").replace("%2C", ",")
            items = [pod_json(n, p) for n, p in c.pods.items() if matches(p["labels"], selector)]
            return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                    "items": items})
        if parts[:5] == ["api", "v1", "namespaces", NS, "pods"] and method == "PATCH":
            pod = c.pods[parts[5]]
            pod["annotations"].update(body["metadata"]["annotations"])
            return self._send(200, pod_json(parts[5], pod))
        self._send(404, {"kind": "Status", "code": 404})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler], addr: str = "127.0.0.1",
          port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((addr, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, int]]:
    state = Cluster()
    handler = type("Handler", (FakeAPI,), {"cluster": state})
    server = serve(handler)
    yield state, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def kubeconfig(tmp_path: Path, cluster: tuple[Cluster, int]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({  # JSON is YAML: the client reads it like any kubeconfig
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{cluster[1]}"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    return path


@pytest.fixture
def broker_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/broker.db"


@pytest.fixture
def broker(broker_url: str) -> Iterator[Broker]:
    b = from_url(broker_url)
    yield b
    b.close()


def make_daemon(kubeconfig: Path, broker: Broker, q: str, metrics_port: int = 9100,
                watch_url: str = "", **rule: Any) -> Daemon:
    """A daemon over one Deployment target, built from a config as `conveyor autoscaler`
    builds it. Its clock starts at 0 for `tick(now)`; with `watch_url` it runs on the real
    clock and watches for new work."""
    config = configs.parse({
        "kubernetes": {"namespace": NS, "kubeconfig": str(kubeconfig)},
        "targets": {"default": {"kind": "kubernetes", "deployment": "worker-default",
                                "queues": [q], "slots_per_replica": 4, "max_replicas": 5,
                                "worker_metrics_port": metrics_port, **rule}}})
    [target_config] = config.targets
    target = daemons.make_target(target_config, config)
    if watch_url:
        return Daemon([(target_config, target)], broker, AutoscalerMetrics(),
                      lambda: from_url(watch_url))
    return Daemon([(target_config, target)], broker, AutoscalerMetrics(), clock=lambda: 0.0)


def publish(broker: Broker, q: str, n: int) -> None:
    for _ in range(n):
        broker.publish(q, b'{"v":1}')


def tick(daemon: Daemon, now: float) -> None:
    for s in daemon.scaled:
        s.due = now
    daemon.tick(now)


def test_scales_up_from_zero_on_backlog(cluster: tuple[Cluster, int], kubeconfig: Path,
                                        broker: Broker, unique: str) -> None:
    state, _ = cluster
    state.replicas["worker-default"] = 0
    daemon = make_daemon(kubeconfig, broker, unique, stabilization_window=0)
    tick(daemon, 0)
    assert state.replicas["worker-default"] == 0 and not state.patches("scale")
    publish(broker, unique, 10)
    tick(daemon, 5)
    assert state.patches("scale") == [{"spec": {"replicas": 1}}]  # activation: 0 -> 1
    tick(daemon, 10)
    assert state.replicas["worker-default"] == 3  # ceil(10 / 4)
    publish(broker, unique, 100)
    tick(daemon, 15)
    assert state.replicas["worker-default"] == 5  # max_replicas
    daemon.close()


def test_back_to_zero_after_the_cooldown(cluster: tuple[Cluster, int], kubeconfig: Path,
                                         broker: Broker, unique: str) -> None:
    state, _ = cluster
    state.replicas["worker-default"] = 3
    daemon = make_daemon(kubeconfig, broker, unique, cooldown=60, stabilization_window=0,
                         worker_metrics_port=0)
    publish(broker, unique, 1)
    [delivery] = [d for d in [next(broker.consume([unique]))] if d]  # one task in flight
    tick(daemon, 0)
    assert state.replicas["worker-default"] == 1
    tick(daemon, 100)
    assert state.replicas["worker-default"] == 1, "a task in flight is work: no zero"
    broker.ack(delivery)
    for now in (105, 130, 164.9):
        tick(daemon, now)
        assert state.replicas["worker-default"] == 1
    tick(daemon, 165)
    assert state.replicas["worker-default"] == 0
    assert daemon.metrics.scalings.labels("default", "down")._value.get() == 2
    daemon.close()


class UnreadableBroker(SQLiteBroker):
    """A broker whose depth cannot be read, as when RabbitMQ's management API is down."""

    def depth(self, queue: str) -> Depth:
        raise BrokerConnectionError(f"management API unreachable reading {queue!r}")


def test_fallback_when_depth_cannot_be_read(cluster: tuple[Cluster, int], kubeconfig: Path,
                                            broker_url: str, unique: str) -> None:
    state, _ = cluster
    state.replicas["worker-default"] = 0
    unreadable = UnreadableBroker(broker_url)
    daemon = make_daemon(kubeconfig, unreadable, unique, fallback_replicas=2, cooldown=0)
    for now in (0, 5, 10, 1000):
        tick(daemon, now)
        assert state.replicas["worker-default"] == 2, "fallback, never zero"
    assert daemon.metrics.errors.labels("default", "depth")._value.get() == 4
    daemon.close()


def test_api_errors_leave_the_target_alone(cluster: tuple[Cluster, int], kubeconfig: Path,
                                           broker: Broker, unique: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    state, _ = cluster
    state.replicas["worker-default"] = 2
    daemon = make_daemon(kubeconfig, broker, unique, cooldown=0)
    state.fail_with = 403
    tick(daemon, 0)
    assert "HTTP 403" in caplog.text and "Role" in caplog.text
    assert daemon.metrics.errors.labels("default", "target")._value.get() == 1
    state.fail_with = 0
    tick(daemon, 5)
    assert state.replicas["worker-default"] == 0, "works again once the API answers"
    daemon.close()


def test_a_missing_deployment_says_what_to_check(cluster: tuple[Cluster, int],
                                                 kubeconfig: Path, broker: Broker, unique: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    daemon = make_daemon(kubeconfig, broker, unique)
    tick(daemon, 0)
    assert "HTTP 404" in caplog.text and "deployment name and namespace" in caplog.text
    daemon.close()


class MetricsHandler(BaseHTTPRequestHandler):
    in_flight = 0

    def do_GET(self) -> None:  # noqa: N802
        body = (f"# HELP conveyor_in_flight Deliveries held by this worker\n"
                f"# TYPE conveyor_in_flight gauge\nconveyor_in_flight {self.in_flight}.0\n"
                ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_idle_pods_are_marked_for_deletion_first(cluster: tuple[Cluster, int],
                                                 kubeconfig: Path, broker: Broker,
                                                 unique: str) -> None:
    """Scenario 6: before 3 -> 1, the idle pod gets the lowest deletion cost, the busy one
    the highest, the one that cannot be asked in between; the scale comes after."""
    state, _ = cluster
    state.replicas["worker-default"] = 3
    port = free_port("127.0.0.2", "127.0.0.3")
    servers = [serve(type("Idle", (MetricsHandler,), {"in_flight": 0}), "127.0.0.2", port),
               serve(type("Busy", (MetricsHandler,), {"in_flight": 3}), "127.0.0.3", port)]
    labels = {"app": "conveyor-worker", "queue": "default"}
    for name, ip in (("idle", "127.0.0.2"), ("busy", "127.0.0.3"), ("mute", "127.0.0.4")):
        state.pods[name] = {"labels": labels, "ip": ip, "annotations": {}}
    state.pods["other"] = {"labels": {"app": "else"}, "ip": "127.0.0.5", "annotations": {}}
    publish(broker, unique, 3)
    daemon = make_daemon(kubeconfig, broker, unique, metrics_port=port, stabilization_window=0)
    tick(daemon, 0)
    assert state.replicas["worker-default"] == 1
    costs = {name: pod["annotations"].get(COST) for name, pod in state.pods.items()}
    assert costs == {"idle": "-1000", "busy": "1003", "mute": "0", "other": None}
    kinds = [("pods" if "/pods/" in path else "scale") for method, path, _ in state.requests
             if method == "PATCH"]
    assert kinds == ["pods", "pods", "pods", "scale"]
    for server in servers:
        server.shutdown()
        server.server_close()
    daemon.close()


def test_work_at_zero_wakes_it_before_the_next_poll(cluster: tuple[Cluster, int],
                                                    kubeconfig: Path, broker: Broker,
                                                    broker_url: str, unique: str) -> None:
    """Scenario 7: polling every 30 s, yet a publish at zero scales to one at once."""
    state, _ = cluster
    state.replicas["worker-default"] = 0
    daemon = make_daemon(kubeconfig, broker, unique, watch_url=broker_url,
                         polling_interval=30)
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while not state.requests and time.monotonic() < deadline:
            time.sleep(0.01)  # the first evaluation: at zero, nothing to do
        time.sleep(0.2)
        published = time.monotonic()
        publish(broker, unique, 1)
        while state.replicas["worker-default"] == 0 and time.monotonic() < published + 10:
            time.sleep(0.005)
        waited = time.monotonic() - published
    finally:
        daemon.stop()
        runner.join(timeout=30)
    assert state.replicas["worker-default"] == 1
    assert waited < 1.0, f"woke after {waited:.3f}s"
    assert daemon.metrics.wakeups.labels("default")._value.get() == 1


def test_ready_messages_a_full_limit_blocks_do_not_scale_it_up(
        cluster: tuple[Cluster, int], kubeconfig: Path, broker: Broker, broker_url: str,
        unique: str) -> None:
    """Issue 19: 500 tasks of one key with max=2, two of them running: the replicas those
    two need, not 500 / 4 slots; raised at run time to max=500, the backlog counts again.
    Built as `conveyor autoscaler` builds it: the limiter is the workers' (the broker's).
    KEDA's endpoint counts the same."""
    state, _ = cluster
    state.replicas["worker-default"] = 1
    codec = Codec()
    broker.publish_many([Publication(unique, codec.encode(
        flow_tasks.tenant_job.message(("acme", "/dev/null"), queue=unique)))
        for _ in range(500)])
    steps = broker.consume([unique], prefetch=2)
    running = [next(steps), next(steps)]  # claimed and holding the key's two tokens
    store = limits.from_url(store_urls(broker_url).limits)
    for delivery in running:
        assert delivery is not None
        message = codec.decode(delivery.body)
        assert store.admit(Parcel(message.id, unique, delivery.body), limits_of(
            message.headers), time.time(), 600).granted
    port = free_port()
    config = configs.parse({
        "broker_url": broker_url, "metrics_port": port, "metrics_addr": "127.0.0.1",
        "kubernetes": {"namespace": NS, "kubeconfig": str(kubeconfig)},
        "targets": {"default": {"kind": "kubernetes", "deployment": "worker-default",
                                "queues": [unique], "slots_per_replica": 4,
                                "max_replicas": 5, "stabilization_window": 0}}})
    daemon, server = daemons.build(config)
    try:
        [scaled] = daemon.scaled
        decision = daemon.evaluate(scaled, 0.0)
        assert decision is not None and decision.replicas == 1, decision  # ceil(2 / 4)
        assert "0 ready + 2 in flight (498 more blocked by limits)" in decision.reason
        with urlopen(f"http://127.0.0.1:{port}/api/v1/queues/{unique}", timeout=10) as reply:
            keda = json.load(reply)
        assert (keda["ready"], keda["in_flight"], keda["blocked"], keda["active"]) == \
            (498, 2, 498, 2)
        store.set_limit("tenant:acme", Override(max=500))
        decision = daemon.evaluate(scaled, 1.0)
        assert decision is not None and decision.replicas == 5, decision  # max_replicas
        assert state.replicas["worker-default"] == 5
    finally:
        if server is not None:
            server.close()
        daemon.close()
        store.close()
