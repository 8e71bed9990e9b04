"""The autoscaler's TOML file, read and checked once at start.

A bad file stops `conveyor autoscaler` before it touches anything, with one line naming
the file, the key and what is allowed. Unknown keys are errors too: a misspelt
`cooldown_period` must not silently leave the 300 s default in place.

    broker_url = "redis://redis:6379/0"   # else CONVEYOR_BROKER_URL, else embedded SQLite
    state_url = "postgresql://…"            # where decisions are recorded for the dashboard
                                            # (else CONVEYOR_STATE_URL; embedded SQLite when
                                            # no broker_url is given either)
    limits_url = ""                         # flow control's store, as the workers' (else
                                            # CONVEYOR_LIMITS_URL, else found as they find it)
    metrics_port = 9400                     # /metrics and /api/v1/queues/<q> (0: off)

    [kubernetes]                            # for kind = "kubernetes" targets
    namespace = "conveyor"
    kubeconfig = ""                         # "": in-cluster, else ~/.kube/config

    [targets.default]
    kind = "kubernetes"                     # or "local": worker processes on this machine
    deployment = "conveyor-worker-default"
    queues = ["default"]
    slots_per_replica = 4                   # the workers' --concurrency
    max_replicas = 10
    # min_replicas = 0, activation_threshold = 0, polling_interval = 5, cooldown = 300,
    # initial_cooldown = 0, stabilization_window = 300, fallback_replicas = 1,
    # worker_metrics_port = 9100 (kubernetes; 0: busy/idle unknown),
    # drain_timeout = 30 and worker_args = [] (local)

Precedence, as everywhere in Conveyor: flags > CONVEYOR_* environment > this file > defaults
(the CLI applies the first two). The top-level URLs and metrics_port are settings of the one
table (`settings_table.ROWS`, `SHARED` below), checked as conveyor.toml's are.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor import kinds
from conveyor.autoscaler.policy import Rule
from conveyor.errors import ConfigError
from conveyor.settings_table import ROWS

KINDS = ("kubernetes", "local")
_KIND_KEYS = {"kubernetes": ("deployment", "namespace", "worker_metrics_port"),
              "local": ("drain_timeout", "worker_args")}
Check = Callable[[Any], str | None]
#: The file's top-level keys that are settings of the table (conveyor.toml's, the
#: variables'): the same meaning and the same check. metrics_port is autoscaler_metrics_port.
SHARED = {"broker_url": "CONVEYOR_BROKER_URL", "state_url": "CONVEYOR_STATE_URL",
          "limits_url": "CONVEYOR_LIMITS_URL", "metrics_port": "CONVEYOR_AUTOSCALER_METRICS_PORT"}


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str = "default"
    kubeconfig: str = ""   # empty: in-cluster config, else the default kubeconfig
    context: str = ""


@dataclass(frozen=True)
class TargetConfig:
    """One scaled target: which queues it serves, how it scales, and where it lives."""

    name: str
    kind: str
    queues: tuple[str, ...]
    rule: Rule = field(default_factory=Rule)
    polling_interval: float = 5.0
    deployment: str = ""           # kubernetes
    namespace: str = ""            # kubernetes; empty: [kubernetes].namespace
    worker_metrics_port: int = 9100  # kubernetes: where pods serve conveyor_in_flight
    drain_timeout: float = 30.0    # local: the workers' --drain-timeout
    worker_args: tuple[str, ...] = ()  # local: more `conveyor worker` flags


@dataclass(frozen=True)
class AutoscalerConfig:
    broker_url: str = ""
    state_url: str = ""
    limits_url: str = ""   # else CONVEYOR_LIMITS_URL, else where the workers keep them
    metrics_port: int = 9400
    metrics_addr: str = "0.0.0.0"
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    targets: tuple[TargetConfig, ...] = ()


def load(path: str | Path) -> AutoscalerConfig:
    """Read and check the file; ConfigError naming the key if anything is wrong."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read autoscaler config {path}: {exc.strerror}; pass an "
                          "existing file with --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"autoscaler config {path} is not valid TOML: {exc}") from None
    return parse(data, str(path))


def parse(data: dict[str, Any], source: str = "autoscaler config") -> AutoscalerConfig:
    top = _Table(data, "", source)
    config = AutoscalerConfig(
        broker_url=top.get("broker_url", str, "", _as_setting("broker_url")),
        state_url=top.get("state_url", str, "", _as_setting("state_url")),
        limits_url=top.get("limits_url", str, "", _as_setting("limits_url")),
        metrics_port=top.get("metrics_port", int, 9400, _as_setting("metrics_port")),
        metrics_addr=top.get("metrics_addr", str, "0.0.0.0"),
        kubernetes=_kubernetes(top.table("kubernetes")),
        targets=tuple(_target(name, top.table("targets").table(name))
                      for name in top.get("targets", dict, {})))
    top.done()
    _no_shared_deployments(config, source)
    return config


def _kubernetes(t: _Table) -> KubernetesSettings:
    settings = KubernetesSettings(namespace=t.get("namespace", str, "default", _nonempty),
                                  kubeconfig=t.get("kubeconfig", str, ""),
                                  context=t.get("context", str, ""))
    t.done()
    return settings


def _target(name: str, t: _Table) -> TargetConfig:
    kind = t.get("kind", str, None, lambda v: None if v in KINDS else
                 f"must be one of {', '.join(KINDS)}")
    for other, keys in _KIND_KEYS.items():
        if other != kind:
            t.forbid(keys, f'only for kind = "{other}" targets')
    config = TargetConfig(
        name=name, kind=kind, queues=tuple(t.get("queues", list, None, _queue_names)),
        rule=_rule(t), polling_interval=t.get("polling_interval", float, 5.0, _positive),
        deployment=t.get("deployment", str, "" if kind == "local" else None, _nonempty),
        namespace=t.get("namespace", str, ""),
        worker_metrics_port=t.get("worker_metrics_port", int, 9100, _port),
        drain_timeout=t.get("drain_timeout", float, 30.0, _positive),
        worker_args=tuple(t.get("worker_args", list, [], _strings)))
    t.done()
    return config


def _rule(t: _Table) -> Rule:
    min_replicas = t.get("min_replicas", int, 0, _at_least(0))
    max_replicas = t.get("max_replicas", int, 10, _at_least(max(1, min_replicas)))
    return Rule(
        slots_per_replica=t.get("slots_per_replica", int, 1, _at_least(1)),
        activation_threshold=t.get("activation_threshold", int, 0, _at_least(0)),
        min_replicas=min_replicas, max_replicas=max_replicas,
        cooldown=t.get("cooldown", float, 300.0, _at_least(0)),
        initial_cooldown=t.get("initial_cooldown", float, 0.0, _at_least(0)),
        stabilization_window=t.get("stabilization_window", float, 300.0, _at_least(0)),
        fallback_replicas=t.get("fallback_replicas", int, 1, lambda v: None
                                if 1 <= v <= max_replicas else
                                f"must be 1 to max_replicas ({max_replicas}): while depth "
                                "cannot be read a target never scales to zero"))


def _no_shared_deployments(config: AutoscalerConfig, source: str) -> None:
    seen: dict[tuple[str, str], str] = {}
    for target in config.targets:
        if target.kind != "kubernetes":
            continue
        key = (target.namespace or config.kubernetes.namespace, target.deployment)
        if key in seen:
            raise ConfigError(f"{source}: targets.{target.name}.deployment = "
                              f"{target.deployment!r} is already scaled by targets.{seen[key]}; "
                              "give each Deployment one target, listing all its queues")
        seen[key] = target.name


class _Table:
    """One TOML table being read: typed gets that name the key in every error."""

    def __init__(self, data: dict[str, Any], where: str, source: str) -> None:
        self.data, self.where, self.source = data, where, source
        self.used: set[str] = set()

    def fail(self, key: str, problem: str) -> ConfigError:
        shown = f" = {self.data[key]!r}" if key in self.data else ""
        return ConfigError(f"{self.source}: {self.where}{key}{shown}: {problem}")

    def get(self, key: str, kind: type, default: Any, check: Check | None = None) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is None:
                raise self.fail(key, "is required")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.fail(key, f"must be {_KIND_NAMES.get(kind, kind.__name__)}")
        problem = check(value) if check else None
        if problem:
            raise self.fail(key, problem)
        return value

    def table(self, key: str) -> _Table:
        return _Table(self.get(key, dict, {}), f"{self.where}{key}.", self.source)

    def forbid(self, keys: tuple[str, ...], why: str) -> None:
        for key in keys:
            if key in self.data:
                raise self.fail(key, why)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], "is not a setting here (misspelt?)")


_KIND_NAMES = {int: "a whole number", float: "a number of seconds", str: "a string",
               list: "a list", dict: "a table", bool: "true or false"}


def _at_least(low: float) -> Check:
    return lambda v: None if v >= low else f"must be {low:g} or more"


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be more than 0"


def _kind(kind: Callable[[str], Any]) -> Check:
    """A check from a kind of the settings (`conveyor.kinds`): its refusal, or None."""
    def check(value: Any) -> str | None:
        try:
            kind(str(value))
        except (ValueError, ConfigError) as exc:
            return str(exc)
        return None
    return check


def _as_setting(key: str) -> Check:
    """The check the settings table gives the same setting."""
    return _kind(ROWS[SHARED[key]].kind)


_port = _kind(kinds.port)


def _nonempty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def _strings(value: list[Any]) -> str | None:
    return None if all(isinstance(v, str) for v in value) else "must be a list of strings"


def _queue_names(value: list[Any]) -> str | None:
    if not value or not all(isinstance(v, str) and v.strip() for v in value):
        return 'must list one or more queue names, e.g. ["default"]'
    return None
