"""A worker Deployment, scaled through its `scale` subresource with the official client.

Reading and patching `deployments/scale` needs no other right on the Deployment, and the
scale's `status.selector` names the pods, so the Role stays at get/patch on
deployments/scale and list/patch on pods (see deploy/k8s/autoscaler.yaml).

Before scaling down, each running pod's /metrics is read (`conveyor_in_flight`) and the
pod annotated with `controller.kubernetes.io/pod-deletion-cost`: low when idle, high when
busy, in between when it cannot be asked. The ReplicaSet controller then removes idle pods
first (Kubernetes alone cannot tell them apart); a busy pod that is removed anyway drains
on SIGTERM within terminationGracePeriodSeconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from conveyor.autoscaler.config import KubernetesSettings
from conveyor.autoscaler.probes import deletion_cost, worker_in_flight
from conveyor.autoscaler.targets import TargetError
from conveyor.errors import ConfigError

log = logging.getLogger("conveyor.autoscaler")

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: Seconds for one API call: a hung API server must not stall every target's loop.
REQUEST_TIMEOUT = 10.0
ReadInFlight = Callable[[str], int | None]


def api_client(settings: KubernetesSettings) -> k8s.ApiClient:
    """In-cluster credentials, else the kubeconfig (the file named, or ~/.kube/config)."""
    configuration = k8s.Configuration()
    try:
        if settings.kubeconfig:
            k8s_config.load_kube_config(settings.kubeconfig, settings.context or None,
                                        client_configuration=configuration)
        else:
            _in_cluster_or_default(configuration, settings.context)
    except (k8s_config.ConfigException, OSError) as exc:
        raise ConfigError(f"no usable Kubernetes credentials ({exc}): run in a pod with the "
                          "conveyor-autoscaler ServiceAccount, or set [kubernetes].kubeconfig "
                          "in the autoscaler config") from None
    configuration.retries = 1
    return k8s.ApiClient(configuration)


def _in_cluster_or_default(configuration: k8s.Configuration, context: str) -> None:
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(context=context or None, client_configuration=configuration)


class DeploymentTarget:
    """One Deployment's replica count, through the official client."""

    def __init__(self, name: str, deployment: str, namespace: str, api: k8s.ApiClient,
                 worker_metrics_port: int = 9100,
                 read_in_flight: ReadInFlight = worker_in_flight) -> None:
        self.name, self.deployment, self.namespace = name, deployment, namespace
        self.worker_metrics_port = worker_metrics_port
        self._api = api
        self._apps = k8s.AppsV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._read_in_flight = read_in_flight
        self._selector = ""

    @property
    def where(self) -> str:
        return f"deployment {self.namespace}/{self.deployment}"

    def replicas(self) -> int:
        scale = self._call("read the scale of", self._apps.read_namespaced_deployment_scale,
                           self.deployment, self.namespace)
        self._selector = (scale.status.selector if scale.status else "") or ""
        return int(scale.spec.replicas or 0) if scale.spec else 0

    def scale(self, replicas: int, current: int) -> None:
        if replicas < current:
            self.mark_pods()
        self._call("scale", self._apps.patch_namespaced_deployment_scale, self.deployment,
                   self.namespace, {"spec": {"replicas": replicas}})

    def mark_pods(self) -> None:
        """Annotate each running pod with its deletion cost, so idle pods go first.

        A failure here is logged, not raised: scaling down still drains, just not idle-first.
        """
        if not self._selector or not self.worker_metrics_port:
            log.warning("%s: cannot tell idle pods from busy ones (%s); Kubernetes picks which "
                        "to remove, and they drain on SIGTERM", self.where,
                        "worker_metrics_port = 0" if self._selector else "its scale has no "
                        "status.selector yet")
            return
        try:
            pods = self._call("list the pods of", self._core.list_namespaced_pod,
                              self.namespace, label_selector=self._selector).items
            costs = self._costs([p for p in pods if _serving(p)])
            for pod, cost in costs:
                self._annotate(pod, cost)
        except TargetError as exc:
            log.warning("%s; scaling down without marking idle pods first", exc)

    def _costs(self, pods: list[Any]) -> list[tuple[Any, int]]:
        urls = [f"http://{p.status.pod_ip}:{self.worker_metrics_port}/metrics" for p in pods]
        if not urls:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
            loads = list(pool.map(self._read_in_flight, urls))
        return [(pod, deletion_cost(load)) for pod, load in zip(pods, loads, strict=True)]

    def _annotate(self, pod: Any, cost: int) -> None:
        annotations = pod.metadata.annotations or {}
        if annotations.get(DELETION_COST) == str(cost):
            return
        self._call(f"annotate pod {pod.metadata.name} of", self._core.patch_namespaced_pod,
                   pod.metadata.name, self.namespace,
                   {"metadata": {"annotations": {DELETION_COST: str(cost)}}})

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call; any failure becomes a TargetError that says what to check."""
        try:
            return method(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            hint = {403: "give the autoscaler's Role this right (deploy/k8s/autoscaler.yaml)",
                    404: "check the deployment name and namespace in the autoscaler config"
                    }.get(exc.status or 0, "see the API server's answer above")
            raise TargetError(f"{self.where}: cannot {what} it: HTTP {exc.status} "
                              f"{exc.reason}; {hint}") from None
        except (HTTPError, OSError) as exc:
            raise TargetError(f"{self.where}: cannot {what} it: the Kubernetes API at "
                              f"{self._api.configuration.host} did not answer "
                              f"({type(exc).__name__}: {exc})") from None

    def close(self) -> None:
        self._api.close()


def _serving(pod: Any) -> bool:
    """Running, not terminating, with an address to ask."""
    status, meta = pod.status, pod.metadata
    return bool(status and status.phase == "Running" and status.pod_ip
                and not (meta and meta.deletion_timestamp))
