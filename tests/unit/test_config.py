"""Configuration: one precedence (flags > env > file > defaults), readable errors, a catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor import cli, config
from conveyor.config import Settings
from conveyor.errors import ConfigError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean environment: no CONVEYOR_* variables, cwd and data dir in tmp_path."""
    import os
    for name in [n for n in os.environ if n.startswith("CONVEYOR_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVEYOR_HOME", str(tmp_path / "data"))
    return tmp_path


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return cli.build_parser()[0].parse_args(list(argv))


def test_precedence_flag_over_env_over_file_over_default(home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse("worker").concurrency >= 1
    (home / "conveyor.toml").write_text("concurrency = 3\nqueues = [\"a\", \"b\"]\n")
    assert parse("worker").concurrency == 3
    assert parse("worker").queues == ("a", "b")
    monkeypatch.setenv("CONVEYOR_CONCURRENCY", "5")
    assert parse("worker").concurrency == 5
    assert parse("worker", "-c", "7").concurrency == 7


def test_settings_read_the_file_too(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = home / "elsewhere.toml"
    path.write_text('state_url = "sqlite:///x.db"\nmax_message_bytes = "2MiB"\n')
    monkeypatch.setenv("CONVEYOR_CONFIG_FILE", str(path))
    settings = Settings.from_env()
    assert settings.state_url == "sqlite:///x.db"
    assert settings.max_message_bytes == 2 * 1024**2
    assert Settings.from_env({}).state_url == ""   # an explicit env means exactly that


@pytest.mark.parametrize(("where", "text", "expected"), [
    ("env", "many", "CONVEYOR_CONCURRENCY='many' is not allowed: must be a whole number"),
    ("file", "concurrency = 0",
     "conveyor.toml: concurrency='0' is not allowed: must be a whole number, 1 or more"),
    ("file", "concurency = 4", "conveyor.toml: concurency = 4 is not a setting (misspelt?)"),
    ("file", "[worker]\nx = 1", "[worker] is a table"),
])
def test_a_wrong_value_names_key_value_and_what_is_allowed(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        where: str, text: str, expected: str) -> None:
    if where == "env":
        monkeypatch.setenv("CONVEYOR_CONCURRENCY", text)
    else:
        (home / "conveyor.toml").write_text(text + "\n")
    assert cli.main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_missing_explicit_file_is_an_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_CONFIG_FILE", str(home / "nope.toml"))
    with pytest.raises(ConfigError, match="no such file"):
        Settings.from_env()


def test_config_show_gives_sources_and_masks_secrets(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "conveyor.toml").write_text('broker_url = "redis://app:s3cret@redis:6379/0"\n')
    monkeypatch.setenv("CONVEYOR_SIGNING_KEY", "hunter2")
    assert cli.main(["config", "show", "--json", "worker", "--concurrency", "9"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and "hunter2" not in out
    rows = {r["key"]: r for r in json.loads(out)["settings"]}
    assert rows["broker_url"]["value"] == "redis://app:***@redis:6379/0"
    assert rows["broker_url"]["source"].startswith("file ")
    assert rows["signing_key"] == {**rows["signing_key"], "value": "***", "source": "env"}
    assert rows["concurrency"]["value"] == "9" and rows["concurrency"]["source"] == "flag"
    assert rows["drain_timeout"]["source"] == "default"


def test_every_setting_has_help_and_one_variable_per_key() -> None:
    _, catalog = cli.build_parser()
    for key in catalog.values():
        assert key.help, key.env
        assert key.env.startswith("CONVEYOR_") and config.key_name(key.env) == key.name
