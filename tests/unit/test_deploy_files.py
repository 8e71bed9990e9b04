"""The compose stack and the Dockerfile, checked offline (there is no Docker engine here):
structure, start order, health checks, memory caps, every command a real `conveyor`
command (parsed by the real parser), and every /metrics endpoint scraped by Prometheus."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from conveyor import cli
from conveyor.autoscaler.config import load as load_autoscaler
from conveyor.kinds import parse_size

ROOT = Path(__file__).parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ENGINES = {"rabbitmq", "redis", "postgres"}
CONVEYOR = {name: s for name, s in SERVICES.items() if s.get("image", "").startswith("conveyor")}
WORKERS = {name: s for name, s in CONVEYOR.items() if s["command"][0] == "worker"}


def flag(command: list[str], name: str) -> str:
    [value] = [c.split("=", 1)[1] for c in command if c.startswith(f"--{name}=")]
    return value


def seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)s", text)
    assert match, f"stop_grace_period {text!r}: write it in seconds, e.g. 45s"
    return float(match.group(1))


def test_the_stack_has_every_part() -> None:
    assert ENGINES | {"scheduler", "worker-default", "worker-heavy", "autoscaler",
                      "prometheus"} <= set(SERVICES)
    assert {flag(w["command"], "queues") for w in WORKERS.values()} == {"default", "heavy"}


@pytest.mark.parametrize("name", sorted(CONVEYOR))
def test_every_command_is_a_real_conveyor_command(name: str) -> None:
    service = SERVICES[name]
    commands = [service["command"]]
    health = service["healthcheck"]["test"]
    if health[1] == "conveyor":
        commands.append(health[2:])
    for command in commands:
        args = cli.build_parser()[0].parse_args(command)   # SystemExit on an unknown flag
        assert callable(args.run)


@pytest.mark.parametrize("name", sorted(CONVEYOR))
def test_conveyor_services_start_after_healthy_engines_and_share_one_configuration(
        name: str) -> None:
    service = SERVICES[name]
    assert {e: {"condition": "service_healthy"} for e in ENGINES} == service["depends_on"]
    env = service["environment"]
    assert env["CONVEYOR_BROKER_URL"].startswith("amqp://") and "@rabbitmq:" in \
        env["CONVEYOR_BROKER_URL"]
    assert "@postgres:5432/" in env["CONVEYOR_STATE_URL"]
    assert service["healthcheck"]["test"][0] == "CMD"


def test_every_service_has_a_health_check_and_prometheus_starts_last() -> None:
    for name, service in SERVICES.items():
        assert name == "prometheus" or "healthcheck" in service, name
    after = SERVICES["prometheus"]["depends_on"]
    assert set(after) == {"worker-default", "worker-heavy", "autoscaler"}
    assert all(v == {"condition": "service_healthy"} for v in after.values())


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_workers_have_memory_caps_and_time_to_drain(name: str) -> None:
    service = WORKERS[name]
    command = service["command"]
    container = parse_size(service["mem_limit"].upper().replace("G", "GiB"))
    per_task = parse_size(flag(command, "memory-limit"))
    assert 0 < per_task < container
    drain = float(flag(command, "drain-timeout"))
    assert seconds(service["stop_grace_period"]) >= drain + 15


def metrics_ports() -> dict[str, int]:
    """service -> port of the /metrics it serves."""
    ports = {name: int(flag(s["command"], "metrics-port")) for name, s in WORKERS.items()}
    toml = next(v for v in SERVICES["autoscaler"]["volumes"] if v.endswith(".toml:ro"))
    ports["autoscaler"] = load_autoscaler(COMPOSE_DIR / toml.split(":")[0]).metrics_port
    ports["scheduler"] = int(flag(SERVICES["scheduler"]["command"], "metrics-port"))
    return ports


def test_prometheus_scrapes_every_metrics_endpoint_and_nothing_else() -> None:
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert targets == {f"{name}:{port}" for name, port in metrics_ports().items()}


def test_mounted_files_exist() -> None:
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name} mounts missing {source}"


# -- the Dockerfile -----------------------------------------------------------------------------

def instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last:]


def test_dockerfile_final_stage_is_slim_and_runs_conveyor_as_non_root() -> None:
    stage = final_stage()
    assert re.fullmatch(r"python:3\.1[1-9]-slim", stage[0][1])
    ops = [op for op, _ in stage]
    user = stage[ops.index("USER")][1].split(":")[0]
    assert user not in ("0", "root") and ops.index("USER") > max(
        i for i, op in enumerate(ops) if op == "RUN")
    assert json.loads(dict(stage)["ENTRYPOINT"]) == ["conveyor"]
    assert cli.build_parser()[0].parse_args(json.loads(dict(stage)["CMD"])).run


def test_dockerfile_installs_the_package_from_this_tree_without_caches() -> None:
    steps = instructions()
    copies = [shlex.split(arg) for op, arg in steps if op == "COPY" and "--from" not in arg]
    for copy in copies:
        for source in copy[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: no such path"
    runs = " ".join(arg for op, arg in final_stage() if op == "RUN")
    assert "pip install --no-cache-dir" in runs and "conveyor" in runs


def test_dockerfile_exposes_the_metrics_ports_compose_scrapes() -> None:
    exposed = {int(p) for op, arg in final_stage() if op == "EXPOSE" for p in arg.split()}
    assert set(metrics_ports().values()) <= exposed


# -- the shape workers run in (README: Security model) -----------------------------------------

#: What a root worker needs to drop tasks to another uid and stop them; nothing more.
WORKER_CAPABILITIES = {"SETUID", "SETGID", "KILL"}


def image_users() -> dict[str, int]:
    """Users the Dockerfile's final stage creates: name -> uid."""
    users = {}
    for op, arg in final_stage():
        for command in arg.split("&&") if op == "RUN" else []:
            words = shlex.split(command)
            if words and words[0] == "useradd":
                users[words[-1]] = int(words[words.index("--uid") + 1])
    return users


def test_the_image_has_an_unprivileged_task_user_apart_from_the_service_user() -> None:
    users = image_users()
    service = final_stage()[[op for op, _ in final_stage()].index("USER")][1].split(":")[0]
    assert users.get("conveyor-task", 0) >= 1000
    assert users["conveyor-task"] not in (int(service), 0)


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_workers_run_tasks_as_the_task_user_with_only_the_capabilities_for_that(
        name: str) -> None:
    """Root in the container, tasks dropped to conveyor-task: the safest shape."""
    worker = WORKERS[name]
    assert flag(worker["command"], "uid") in image_users()
    assert flag(worker["command"], "uid") != "conveyor"
    assert worker["user"] in ("0", "0:0", "root")
    assert worker["cap_drop"] == ["ALL"] and set(worker["cap_add"]) == WORKER_CAPABILITIES
    assert "no-new-privileges:true" in worker["security_opt"]
    assert not worker.get("privileged")


@pytest.mark.parametrize("name", sorted(set(CONVEYOR) - set(WORKERS)))
def test_services_that_run_no_task_keep_the_images_unprivileged_user(name: str) -> None:
    assert SERVICES[name].get("user") is None and not SERVICES[name].get("privileged")
