"""deploy/k8s, validated offline: well-formed objects, RBAC no wider than the autoscaler
uses, grace periods that cover the workers' drain, and an autoscaler config that agrees
with the Deployments it scales."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from conveyor.autoscaler.config import AutoscalerConfig, parse

K8S = Path(__file__).parents[2] / "deploy" / "k8s"
NAMESPACE = "conveyor"
#: Seconds a worker may need after its drain timeout to requeue what still runs and exit.
EXIT_MARGIN = (5, 30)


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's own file, not an API object
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


DOCS = documents()


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in DOCS if d["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def flags(deployment: dict[str, Any]) -> dict[str, str]:
    """--name=value flags of a Deployment's container."""
    c = container(deployment)
    argv = [*c.get("command", []), *c.get("args", [])]
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def workers() -> dict[str, dict[str, Any]]:
    return {n: d for n, d in objects("Deployment").items() if flags(d).get("queues")}


def autoscaler_config() -> AutoscalerConfig:
    text = objects("ConfigMap")["conveyor-autoscaler"]["data"]["autoscaler.toml"]
    return parse(tomllib.loads(text), "conveyor-autoscaler ConfigMap")


def test_every_object_is_well_formed() -> None:
    assert len(DOCS) >= 10
    for doc in DOCS:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name"), doc
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]


def test_kustomization_lists_files_that_exist() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    assert "keda-scaledobject.yaml" not in kustomization["resources"], "optional, by hand"


@pytest.mark.parametrize("name", sorted(objects("Deployment")))
def test_deployments_select_their_own_pods(name: str) -> None:
    spec = objects("Deployment")[name]["spec"]
    template_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= template_labels.items()
    c = container(objects("Deployment")[name])
    assert c["image"] and c["command"][0] == "conveyor"


def test_both_worker_deployments_exist() -> None:
    queues = {flags(d)["queues"] for d in workers().values()}
    assert queues == {"default", "heavy"}


@pytest.mark.parametrize("name", sorted(workers()))
def test_grace_period_covers_the_drain(name: str) -> None:
    """Kubernetes SIGKILLs at terminationGracePeriodSeconds: the worker must have had its
    whole --drain-timeout, plus a little to requeue what still runs and exit."""
    deployment = workers()[name]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    drain = float(flags(deployment)["drain-timeout"])
    assert EXIT_MARGIN[0] <= grace - drain <= EXIT_MARGIN[1], (grace, drain)


@pytest.mark.parametrize("name", sorted(workers()))
def test_workers_serve_metrics_where_the_autoscaler_reads_them(name: str) -> None:
    deployment = workers()[name]
    port = int(flags(deployment)["metrics-port"])
    assert {"name": "metrics", "containerPort": port} in container(deployment)["ports"]


def test_autoscaler_role_is_limited_to_what_it_patches() -> None:
    [role] = objects("Role").values()
    rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])),
                     tuple(sorted(r.get("resourceNames", ())))) for r in role["rules"])
    assert rules == [
        (("",), ("pods",), ("list", "patch"), ()),
        (("apps",), ("deployments/scale",), ("get", "patch"),
         tuple(sorted(workers()))),
    ]
    assert not objects("ClusterRole") and not objects("ClusterRoleBinding")


def test_the_role_is_bound_to_the_autoscalers_service_account() -> None:
    [binding] = objects("RoleBinding").values()
    [role] = objects("Role").values()
    [account] = objects("ServiceAccount").values()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": NAMESPACE,
                                    "name": account["metadata"]["name"]}]
    pod = objects("Deployment")["conveyor-autoscaler"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert objects("Deployment")["conveyor-autoscaler"]["spec"]["strategy"] == {
        "type": "Recreate"}, "never two autoscalers at once"


def test_autoscaler_config_agrees_with_the_workers() -> None:
    config = autoscaler_config()
    assert config.kubernetes.namespace == NAMESPACE
    scaled = {t.deployment: t for t in config.targets}
    assert set(scaled) == set(workers())
    for name, deployment in workers().items():
        target, f = scaled[name], flags(deployment)
        assert target.kind == "kubernetes"
        assert ",".join(target.queues) == f["queues"]
        assert target.rule.slots_per_replica == int(f["concurrency"])
        assert target.worker_metrics_port == int(f["metrics-port"])


def test_autoscaler_reads_its_config_from_the_configmap() -> None:
    deployment = objects("Deployment")["conveyor-autoscaler"]
    c = container(deployment)
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["config"]
    assert flags(deployment)["config"] == f"{mount}/autoscaler.toml"
    [volume] = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == "conveyor-autoscaler"
    port = autoscaler_config().metrics_port
    assert {"name": "http", "containerPort": port} in c["ports"]
    service = objects("Service")["conveyor-autoscaler"]
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()


def test_keda_example_reads_active_depth_from_the_autoscaler() -> None:
    [scaled] = objects("ScaledObject").values()
    target = workers()[scaled["spec"]["scaleTargetRef"]["name"]]
    [trigger] = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    url = urlsplit(meta["url"])
    service = objects("Service")["conveyor-autoscaler"]
    assert trigger["type"] == "metrics-api" and meta["valueLocation"] == "active"
    assert url.hostname == f"conveyor-autoscaler.{NAMESPACE}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert url.path == f"/api/v1/queues/{flags(target)['queues']}"
    assert int(meta["targetValue"]) == int(flags(target)["concurrency"])
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["fallback"]["replicas"] >= 1


def test_secrets_are_referenced_never_inlined() -> None:
    assert not objects("Secret")
    for deployment in objects("Deployment").values():
        for env in container(deployment).get("env", []):
            assert "value" not in env or "URL" not in env["name"], env


# -- the shape workers run in (README: Security model) -----------------------------------------

WORKER_CAPABILITIES = {"SETUID", "SETGID", "KILL"}


@pytest.mark.parametrize("name", sorted(workers()))
def test_workers_run_tasks_as_the_task_user_with_only_the_capabilities_for_that(
        name: str) -> None:
    """Root in the container, tasks dropped to the image's conveyor-task user (--uid)."""
    deployment = workers()[name]
    assert flags(deployment)["uid"] == "conveyor-task"
    context = container(deployment)["securityContext"]
    assert context["runAsUser"] == 0 and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"]["add"]) == WORKER_CAPABILITIES
    assert not context.get("privileged")


@pytest.mark.parametrize("name", sorted(set(objects("Deployment")) - set(workers())))
def test_what_runs_no_task_runs_unprivileged(name: str) -> None:
    context = container(objects("Deployment")[name])["securityContext"]
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
