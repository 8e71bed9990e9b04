"""The autoscaler's TOML file: good files parse to typed settings, bad ones name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conveyor import config
from conveyor.autoscaler.config import SHARED, load, parse
from conveyor.autoscaler.policy import Rule
from conveyor.cli import main
from conveyor.errors import ConfigError
from conveyor.settings_table import ROWS

K8S = {"kind": "kubernetes", "deployment": "worker-default", "queues": ["default"]}
LOCAL = {"kind": "local", "queues": ["default"]}


def test_a_full_file(tmp_path: Path) -> None:
    path = tmp_path / "autoscaler.toml"
    path.write_text("""
broker_url = "redis://127.0.0.1:6379/0"
metrics_port = 9500
[kubernetes]
namespace = "conveyor"
[targets.default]
kind = "kubernetes"
deployment = "conveyor-worker-default"
queues = ["default"]
slots_per_replica = 4
activation_threshold = 2
max_replicas = 8
polling_interval = 2.5
cooldown = 120
stabilization_window = 60
fallback_replicas = 2
[targets.heavy]
kind = "local"
queues = ["heavy", "default"]
drain_timeout = 600
worker_args = ["--memory-limit=2GiB"]
""")
    config = load(path)
    assert config.broker_url.startswith("redis://") and config.metrics_port == 9500
    default, heavy = config.targets
    assert default.rule == Rule(slots_per_replica=4, activation_threshold=2, min_replicas=0,
                                max_replicas=8, cooldown=120.0, initial_cooldown=0.0,
                                stabilization_window=60.0, fallback_replicas=2)
    assert (default.deployment, default.polling_interval) == ("conveyor-worker-default", 2.5)
    assert heavy.queues == ("heavy", "default") and heavy.drain_timeout == 600.0
    assert heavy.worker_args == ("--memory-limit=2GiB",)


def test_defaults_are_the_issues() -> None:
    [target] = parse({"targets": {"default": K8S}}).targets
    assert target.polling_interval == 5.0
    assert target.rule.cooldown == 300.0 and target.rule.min_replicas == 0
    assert target.rule.fallback_replicas == 1


@pytest.mark.parametrize("target,fragment", [
    ({**K8S, "max_replicas": 0}, "targets.default.max_replicas = 0: must be 1 or more"),
    ({**K8S, "min_replicas": 3, "max_replicas": 2}, "max_replicas = 2: must be 3 or more"),
    ({**K8S, "min_replicas": -1}, "min_replicas = -1: must be 0 or more"),
    ({**K8S, "slots_per_replica": 0}, "slots_per_replica = 0: must be 1 or more"),
    ({**K8S, "activation_threshold": -2}, "activation_threshold = -2"),
    ({**K8S, "polling_interval": 0}, "polling_interval = 0: must be more than 0"),
    ({**K8S, "cooldown": "5m"}, "cooldown = '5m': must be a number of seconds"),
    ({**K8S, "cooldown": -1}, "cooldown = -1: must be 0 or more"),
    ({**K8S, "max_replicas": True}, "max_replicas = True: must be a whole number"),
    ({**K8S, "fallback_replicas": 0}, "fallback_replicas = 0: must be 1 to max_replicas"),
    ({**K8S, "fallback_replicas": 11}, "fallback_replicas = 11"),
    ({**K8S, "queues": []}, "targets.default.queues = []: must list one or more queue"),
    ({**K8S, "queues": "default"}, "queues = 'default': must be a list"),
    ({**K8S, "cooldown_period": 5}, "targets.default.cooldown_period = 5: is not a setting"),
    ({"queues": ["default"]}, "targets.default.kind: is required"),
    ({**K8S, "kind": "nomad"}, "kind = 'nomad': must be one of kubernetes, local"),
    ({**K8S, "deployment": ""}, "deployment = '': must not be empty"),
    ({"kind": "kubernetes", "queues": ["q"]}, "targets.default.deployment: is required"),
    ({**K8S, "drain_timeout": 30}, 'drain_timeout = 30: only for kind = "local"'),
    ({**LOCAL, "deployment": "x"}, "deployment = 'x': only for kind = \"kubernetes\""),
    ({**LOCAL, "worker_args": [1]}, "worker_args = [1]: must be a list of strings"),
    ({**K8S, "worker_metrics_port": 70000}, "worker_metrics_port = 70000: must be a port"),
])
def test_bad_target_settings_name_the_key(target: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"targets": {"default": target}}, "as.toml")
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("as.toml: ")


@pytest.mark.parametrize("data,fragment", [
    ({"metrics_port": -1}, "metrics_port = -1: must be a port"),
    ({"broker_url": "redis:/h"}, "broker_url = 'redis:/h': must be a URL"),
    ({"state_url": "postgresql://h:x/db"}, "state_url = 'postgresql://h:x/db': its port in "
                                           "'h:x' is not a number"),
    ({"limits_url": "redis://h/zero"}, "limits_url = 'redis://h/zero': its database 'zero' is "
                                       "not a number"),
    ({"brokr_url": "x"}, "brokr_url = 'x': is not a setting here"),
    ({"kubernetes": {"namespace": ""}}, "kubernetes.namespace = '': must not be empty"),
    ({"targets": [K8S]}, "targets = [{"),
    ({"targets": {"a": K8S, "b": K8S}}, "targets.b.deployment = 'worker-default' is already "
                                        "scaled by targets.a"),
])
def test_bad_top_level_settings_name_the_key(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        parse(data)
    assert fragment in str(caught.value)


def test_unreadable_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read autoscaler config .*missing.toml"):
        load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[targets.default\n")
    with pytest.raises(ConfigError, match=r"bad.toml is not valid TOML: .*line 1"):
        load(bad)


def test_the_command_stops_at_start_with_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "autoscaler.toml"
    path.write_text('[targets.default]\nkind = "local"\nqueues = ["q"]\nmax_replicas = -3\n')
    assert main(["autoscaler", f"--config={path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"conveyor: {path}: targets.default.max_replicas = -3: must be 1 or more")


def test_the_file_s_shared_keys_are_the_settings_table_s() -> None:
    """broker_url, state_url, limits_url (and metrics_port, the file's name of
    autoscaler_metrics_port) are settings of the one table, checked as it checks them: a
    wrong URL stops the autoscaler at start, not at its first connection."""
    for key, env in SHARED.items():
        assert env in ROWS
        assert key == config.key_name(env) or (key, env) == (
            "metrics_port", "CONVEYOR_AUTOSCALER_METRICS_PORT")
