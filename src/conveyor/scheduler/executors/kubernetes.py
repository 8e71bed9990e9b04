"""The kubernetes executor: one Pod per attempt, watched to completion.

A pod runs the task's container command (a `dag.command` task, or `executor_config["command"]`
for a registered task) in `executor_config["image"]` (default: the scheduler's
--kubernetes-image), with the task's resource requests and limits (its `memory_limit` becomes
the memory limit), its node selector, `restartPolicy: Never`, and its time limit as
`activeDeadlineSeconds`. The pod name is derived from the task instance and attempt, so a
publish redone after a scheduler crash finds the pod already there (409) instead of running
the task twice.

One watcher thread lists the scheduler's pods and then watches them (list + watch, relisted
every `resync` seconds), and turns what it sees into the same events a worker sends: Running
-> started (then a heartbeat on each relist), Succeeded -> succeeded, Failed -> failed,
oom_killed (OOMKilled), timed_out (DeadlineExceeded) or skipped (an exit code of the task's
`skip_on_exit_code`). A pod Pending for longer than
`pending_timeout` is deleted and its attempt fails with the scheduler's reason (e.g. "0/3
nodes are available: insufficient memory"), so nothing sits "created, watching" for hours.
After a restart, the relist adopts pods that are still running. Finished pods are deleted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from conveyor.events import ENDED_WELL, Event
from conveyor.message import skip_codes
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Report, Workload

log = logging.getLogger("conveyor.scheduler.kubernetes")

MANAGED = "app.kubernetes.io/managed-by=conveyor"
ANNOTATION = "conveyor.io/event"   # the identity every event about this attempt carries


class KubernetesExecutor(Executor):
    name = "kubernetes"

    def __init__(self, api: Any, *, namespace: str = "default", image: str = "",
                 pending_timeout: float = 300.0, resync: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.api = api                    # kubernetes.client.CoreV1Api
        self.namespace = namespace
        self.image = image
        self.pending_timeout = pending_timeout
        self.resync = resync
        self.clock = clock
        self._started: set[str] = set()    # pods reported running
        self._finished: set[str] = set()   # pods reported done (deleted or being deleted)
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, config: Any) -> KubernetesExecutor:
        """In a cluster, its service account; elsewhere, the kubeconfig ($KUBECONFIG)."""
        from kubernetes import client
        from kubernetes import config as kube_config
        try:
            kube_config.load_incluster_config()
        except kube_config.ConfigException:
            kube_config.load_kube_config()
        return cls(client.CoreV1Api(), namespace=config.kubernetes_namespace,
                   image=config.kubernetes_image,
                   pending_timeout=config.kubernetes_pending_timeout)

    # -- submitting -------------------------------------------------------------------------

    def submit(self, workload: Workload) -> None:
        from kubernetes.client.exceptions import ApiException
        pod = self.pod_manifest(workload)
        try:
            self.api.create_namespaced_pod(self.namespace, pod)
        except ApiException as exc:
            if exc.status == 409:          # created before a crash: watch the one there
                return
            if exc.status is not None and 400 <= exc.status < 500:
                raise ExecutorError(f"Kubernetes refused pod {pod['metadata']['name']} "
                                    f"({exc.status} {exc.reason}): {_api_message(exc)}") from None
            raise

    def pod_manifest(self, workload: Workload) -> dict[str, Any]:
        """The Pod for one attempt (a plain manifest, as `kubectl apply` would take)."""
        m, cfg = workload.message, dict(workload.config)
        command = list(m.command) or list(cfg.get("command", []))
        if not command:
            raise ExecutorError(f"task {m.label!r} has no container command: on the "
                                "kubernetes executor use dag.command(...), or give the task "
                                "executor_config={'command': [...]}")
        image = cfg.get("image") or self.image
        if not image:
            raise ExecutorError(f"task {m.label!r} has no image: set executor_config="
                                "{'image': ...} or --kubernetes-image")
        limits = dict(cfg.get("limits", {}))
        if m.memory_limit and "memory" not in limits:
            limits["memory"] = str(m.memory_limit)
        container: dict[str, Any] = {
            "name": "task", "image": image, "command": command,
            "resources": {"requests": dict(cfg.get("requests", {})), "limits": limits},
            "env": [{"name": "CONVEYOR_TI", "value": m.headers.get("ti", "")},
                    {"name": "CONVEYOR_ATTEMPT", "value": str(m.attempt)}]}
        spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container],
                                "nodeSelector": dict(cfg.get("node_selector", {}))}
        if m.time_limit:
            spec["activeDeadlineSeconds"] = max(1, int(m.time_limit))
        identity = {"message_id": m.id, "task": m.label, "attempt": m.attempt,
                    "run_id": m.run_id, "trace_id": m.trace_id, "headers": dict(m.headers)}
        return {"apiVersion": "v1", "kind": "Pod", "spec": spec, "metadata": {
            "name": pod_name(m.headers.get("ti", m.id), m.attempt),
            "labels": {"app.kubernetes.io/managed-by": "conveyor",
                       "conveyor.io/attempt": str(m.attempt)},
            "annotations": {ANNOTATION: json.dumps(identity)}}}

    def withdraw(self, ti: str, attempt: int) -> None:
        """Delete the pod of an attempt timed out before it started (still Pending): a pod
        reads no `expires`, so without this it could start whenever the cluster finds room."""
        from kubernetes.client.exceptions import ApiException
        name = pod_name(ti, attempt)
        self._finished.add(name)   # its DELETED is not an outcome: the attempt has one
        try:
            self.api.delete_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise ExecutorError(f"could not delete pod {name} of a timed-out attempt "
                                    f"({exc.status} {exc.reason}): {_api_message(exc)}"
                                    ) from None
        log.info("pod %s withdrawn: its attempt timed out before it started", name)

    # -- watching ---------------------------------------------------------------------------

    def start(self, report: Report) -> None:
        super().start(report)
        self._thread = threading.Thread(target=self._watch_forever, daemon=True,
                                        name="conveyor-kubernetes-watch")
        self._thread.start()

    def check(self) -> None:
        if self._failure is not None:
            raise ExecutorError(f"the kubernetes pod watcher stopped: {self._failure!r}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _watch_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self.sync_once()
        except BaseException as exc:  # the daemon sees it through check() and stops
            self._failure = exc
            log.exception("kubernetes pod watcher failed")

    def sync_once(self) -> None:
        """List every pod of ours (adopting, heartbeating, timing out), then watch changes
        until the next resync."""
        from kubernetes import watch
        pods = self.api.list_namespaced_pod(self.namespace, label_selector=MANAGED)
        for pod in pods.items:
            self.observe(pod, relisted=True)
        stream = watch.Watch().stream(
            self.api.list_namespaced_pod, self.namespace, label_selector=MANAGED,
            resource_version=pods.metadata.resource_version,
            timeout_seconds=max(1, int(self.resync)))
        for change in stream:
            if self._stop.is_set():
                return
            self.observe(change["object"], deleted=change["type"] == "DELETED")

    def observe(self, pod: Any, relisted: bool = False, deleted: bool = False) -> None:
        """Turn one pod's state into the events due for it."""
        name = pod.metadata.name
        if name in self._finished:
            return
        phase = pod.status.phase if pod.status else "Pending"
        if phase in ("Succeeded", "Failed"):
            self._finish(pod, *outcome(pod))
        elif deleted:
            self._finish(pod, "failed", f"pod {name} was deleted before it finished")
        elif phase == "Running":
            if name not in self._started or relisted:
                self._emit(pod, "started" if name not in self._started else "heartbeat",
                           hostname=pod.spec.node_name or "", pid=0)
                self._started.add(name)
        elif self._pending_for(pod) > self.pending_timeout:
            self._finish(pod, "failed", f"pod {name} was Pending for more than "
                                        f"{self.pending_timeout:g} s: {pending_reason(pod)}")

    def _pending_for(self, pod: Any) -> float:
        created = pod.metadata.creation_timestamp
        return self.clock() - created.timestamp() if created is not None else 0.0

    def _finish(self, pod: Any, kind: str, reason: str = "") -> None:
        from kubernetes.client.exceptions import ApiException
        name = pod.metadata.name
        self._finished.add(name)
        self._started.discard(name)
        error = {} if kind in ENDED_WELL else {"type": "PodFailed",
                                                             "message": reason}
        self._emit(pod, kind, reason=reason if kind != "succeeded" else "", error=error,
                   hostname=pod.spec.node_name or "")
        try:
            self.api.delete_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _emit(self, pod: Any, kind: str, **fields: Any) -> None:
        identity = json.loads((pod.metadata.annotations or {}).get(ANNOTATION, "{}"))
        if not identity:
            log.warning("pod %s carries no %s annotation: not ours, ignored",
                        pod.metadata.name, ANNOTATION)
            return
        self._report(Event(kind=kind, **identity, **fields))


def pod_name(ti: str, attempt: int) -> str:
    """A DNS-1123 name, unique per task instance and attempt."""
    return f"conveyor-{ti.lower()}-{attempt}"[:63]


def outcome(pod: Any) -> tuple[str, str]:
    """(event kind, reason) of a finished pod."""
    if pod.status.phase == "Succeeded":
        return "succeeded", ""
    if pod.status.reason == "DeadlineExceeded":
        return "timed_out", f"pod {pod.metadata.name} passed its activeDeadlineSeconds"
    for status in pod.status.container_statuses or []:
        ended = status.state.terminated if status.state else None
        if ended is None:
            continue
        if ended.reason == "OOMKilled":
            return "oom_killed", (f"container {status.name} was OOM-killed (memory limit "
                                  f"{_limit(pod, status.name)})")
        if ended.exit_code in _skip_codes(pod):   # dag.command(..., skip_on_exit_code=99)
            return "skipped", (f"container {status.name} exited with code {ended.exit_code} "
                               "(skip_on_exit_code)")
        detail = f": {ended.message.strip()}" if ended.message else ""
        return "failed", (f"container {status.name} exited with code {ended.exit_code} "
                          f"({ended.reason or 'Error'}){detail}")
    return "failed", f"pod {pod.metadata.name} failed: {pod.status.message or pod.status.reason}"


def _skip_codes(pod: Any) -> frozenset[int]:
    """The exit codes that skip this pod's task: its message's, kept in its annotation."""
    identity = json.loads((pod.metadata.annotations or {}).get(ANNOTATION, "{}"))
    return skip_codes(identity.get("headers", {}))


def pending_reason(pod: Any) -> str:
    """Where a Pending pod is stuck: unschedulable, or a container that cannot start."""
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"not scheduled ({condition.reason}): {condition.message}"
    for status in (pod.status.container_statuses or []) if pod.status else []:
        waiting = status.state.waiting if status.state else None
        if waiting is not None:
            return f"container {status.name} waiting ({waiting.reason}): {waiting.message}"
    return "no reason given by the cluster (check `kubectl describe pod`)"


def _limit(pod: Any, container: str) -> str:
    for spec in pod.spec.containers:
        if spec.name == container and spec.resources and spec.resources.limits:
            return str(spec.resources.limits.get("memory", "none"))
    return "none"


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.body))
    except (TypeError, ValueError):
        return str(exc.body or exc.reason)

