"""Configuration: one precedence (flags > env > file > defaults), readable errors, a catalog."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import cli, config
from conveyor.config import Settings
from conveyor.errors import ConfigError
from conveyor.scheduler.config import ENV_VARS, SchedulerConfig
from conveyor.scheduler.sampler import DEFAULT_INTERVAL
from conveyor.settings_table import ROWS
from conveyor.worker.config import READ_AHEAD


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


def test_config_show_names_the_embedded_files_an_unset_url_means(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`conveyor config show` is where the Troubleshooting table sends a reader to check the
    URL: with none set, it shows the SQLite files the commands use, not an empty value."""
    assert cli.main(["config", "show"]) == 0
    lines = capsys.readouterr().out.splitlines()
    broker = next(line for line in lines if line.startswith("broker_url "))
    state = next(line for line in lines if line.startswith("state_url "))
    assert f"(embedded) sqlite:///{home / 'data' / 'conveyor.db'}" in broker
    assert " default " in broker
    assert f"(embedded) sqlite:///{home / 'data' / 'scheduler.db'}" in state
    assert not (home / "data").exists()          # naming the file creates nothing
    assert cli.main(["config", "show", "--json"]) == 0   # a script's value stays the setting
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["settings"]}
    assert rows["broker_url"]["value"] == "" and rows["state_url"]["value"] == ""


def test_every_setting_has_help_and_one_variable_per_key() -> None:
    _, catalog = cli.build_parser()
    for key in catalog.values():
        assert key.help, key.env
        assert key.env.startswith("CONVEYOR_") and config.key_name(key.env) == key.name


#: CONVEYOR_* names in src that are not settings: what a worker or an executor hands to a
#: task (its context, its attempt), and the example DAG's own knobs.
NOT_SETTINGS = re.compile(r"CONVEYOR_(CTX(_[A-Z_]+)?|TI|ATTEMPT|REVENUE_[A-Z]+)$")
SRC = Path(__file__).parents[2] / "src" / "conveyor"


def test_every_conveyor_variable_in_the_source_is_a_setting_config_show_lists(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CONVEYOR_DAG_IMPORT_TIMEOUT, CONVEYOR_SCHEDULER_EVENT_LEASE and CONVEYOR_EVENTS_QUEUE
    were read by the scheduler and missing from the catalog: `config show` left them out and
    a conveyor.toml holding them was refused."""
    _, catalog = cli.build_parser()
    known = set(catalog) | {key.renamed.env for key in catalog.values() if key.renamed}
    named = {name for path in SRC.rglob("*.py")
             for name in re.findall(r"CONVEYOR_[A-Z_]*[A-Z]", path.read_text())}
    assert {n for n in named if not NOT_SETTINGS.match(n)} - known == set()
    assert cli.main(["config", "show", "--json"]) == 0
    shown = {row["env"] for row in json.loads(capsys.readouterr().out)["settings"]}
    assert set(catalog) <= shown


def test_the_scheduler_settings_are_read_from_the_file_too(home: Path) -> None:
    (home / "conveyor.toml").write_text(
        'dag_import_timeout = 2\nscheduler_event_lease = 1.5\nevents_queue = "ev"\n'
        'scheduler_control_queue = "ctl"\nscheduler_start_grace = 0\nsigning_key = "k"\n')
    assert cli.main(["config", "show"]) == 0    # the file is not refused
    config = SchedulerConfig.from_env()
    assert (config.dag_import_timeout, config.event_lease, config.events_queue,
            config.control_queue, config.start_grace) == (2.0, 1.5, "ev", "ctl", 0.0)
    assert config.settings.signing_key == "k"   # the shared settings too, as the worker has


def test_the_table_gives_the_scheduler_its_own_defaults() -> None:
    """The table's row and the part's own constant say the same default (the rows with a
    flag give it as its text: executors "queue")."""
    default = SchedulerConfig()
    for name, env in ENV_VARS.items():
        if env in ROWS and not ROWS[env].flags:
            assert ROWS[env].default == getattr(default, name), env
    assert ROWS["CONVEYOR_QUEUE_SAMPLE_INTERVAL"].default == DEFAULT_INTERVAL
    assert ROWS["CONVEYOR_READ_AHEAD"].default == READ_AHEAD


@pytest.mark.parametrize(("text", "expected"), [
    ("scheduler_event_lease = 0", "scheduler_event_lease='0' is not allowed: must be a number "
                                  "of seconds, more than 0"),
    ("dag_import_timeout = \"soon\"", "dag_import_timeout='soon' is not allowed"),
    ("home = \"/srv\"", "home is read from the environment only: set CONVEYOR_HOME instead"),
])
def test_a_wrong_scheduler_or_environment_only_setting_in_the_file_is_one_line(
        home: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    (home / "conveyor.toml").write_text(text + "\n")
    assert cli.main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


@pytest.mark.parametrize(("broker", "state", "expected"), [
    ("", "", ("{home}/conveyor.db", "{home}/scheduler.db", "{home}/results.db",
              "{home}/conveyor.db", "{home}/scheduler.db")),
    ("redis://h:6379/0?prefix=p", "", ("redis://h:6379/0?prefix=p", "{home}/scheduler.db",
                                       "redis://h:6379/0?prefix=p", "redis://h:6379/0?prefix=p",
                                       None)),
    ("postgresql://u@h/db?schema=s&ack_commit=sync", "sqlite:///s.db",
     ("postgresql://u@h/db?schema=s&ack_commit=sync", "sqlite:///s.db",
      "postgresql://u@h/db?schema=s", "postgresql://u@h/db?schema=s&ack_commit=sync",
      "sqlite:///s.db")),
    ("postgresql://u@h/db?retry_seconds=5&vacuum_every=0", "",
     ("postgresql://u@h/db?retry_seconds=5&vacuum_every=0", "{home}/scheduler.db",
      "postgresql://u@h/db", "postgresql://u@h/db?retry_seconds=5&vacuum_every=0&commit=async",
      None)),
    ("postgres://u@h/db", "", ("postgres://u@h/db", "{home}/scheduler.db", "postgres://u@h/db",
                               "postgres://u@h/db?commit=async", None)),
    ("amqp://g@h//", "postgresql://u@h/state", ("amqp://g@h//", "postgresql://u@h/state",
                                                "postgresql://u@h/state",
                                                "postgresql://u@h/state",
                                                "postgresql://u@h/state")),
    ("kombu+redis://h/0", "", ("kombu+redis://h/0", "{home}/scheduler.db",
                               "{home}/scheduler.db", "{home}/scheduler.db", None)),
])
def test_every_store_url_is_resolved_in_one_place_from_the_broker_url(
        home: Path, broker: str, state: str, expected: tuple[str | None, ...]) -> None:
    """broker, state, results, limits, registry: what `Settings.stores()` hands each part."""
    data = f"sqlite:///{home / 'data'}"
    urls = Settings(broker_url=broker, state_url=state).stores()
    assert (urls.broker, urls.state, urls.results, urls.limits, urls.registry) == tuple(
        e.format(home=data) if e else e for e in expected)
    given = Settings(broker_url=broker, result_url="redis://r/1", limits_url="redis://r/2")
    assert (given.stores().results, given.stores().limits) == ("redis://r/1", "redis://r/2")


#: Options that say what to do this once (which run, which message, print JSON), not how a
#: deployment runs: no variable and no file key, so not in the table.
THIS_ONCE = {"--all", "--args", "--burst", "--command", "--conf", "--count", "--dag", "--delay",
             "--dedupe-key", "--executor", "--expires", "--extra", "--fresh", "--from", "--id",
             "--index", "--json", "--kwargs", "--latest-code",
             "--limit", "--logical-date", "--max", "--memory-limit", "--only", "--payload",
             "--per-second",
             "--pin-code", "--priority", "--queue", "--raw", "--reason", "--retries",
             "--retry-delay", "--source",
             "--run-state", "--runs", "--time-limit", "--timeout", "--to", "--unique-for",
             "--unique-key", "--wait", "--wide", "--write"}


def commands(parser: argparse.ArgumentParser, words: str = "") -> Iterator[tuple[str, Any]]:
    """(command, its parser) for every command and sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{words} {name}".strip())
    if words:
        yield words, parser


def test_every_flag_of_every_command_is_a_setting_or_says_what_to_do_once() -> None:
    """A flag that configures a deployment has a variable and a file key, and is in the
    table `config show` lists; the others are the short list above."""
    parser, catalog = cli.build_parser()
    renamed = {key.renamed.flag for key in catalog.values() if key.renamed}
    for command, sub in commands(parser):
        settings = {flag for key in catalog.values() if command in key.commands
                    for flag in key.flags_of.get(command, key.flags)}
        for action in sub._actions:
            for flag in (f for f in action.option_strings if f.startswith("--")):
                if flag in ("--help", *renamed) or (command, flag) == ("demo", "--broker"):
                    continue   # demo: the embedded broker unless told, whatever the environment
                assert flag in settings or flag in THIS_ONCE, f"conveyor {command} {flag}"


def test_a_setting_of_the_table_is_spelled_there_only() -> None:
    """`--broker` was declared by seven commands: a flag's spelling, default and help are its
    row's, and a flag with no row is refused."""
    parser = config.SettingsParser(prog="conveyor worker")
    with pytest.raises(TypeError, match="CONVEYOR_BROKR_URL is not a setting: add its row"):
        config.env_flag(parser, env="CONVEYOR_BROKR_URL")
    _, catalog = cli.build_parser()
    broker = catalog["CONVEYOR_BROKER_URL"]
    assert set(broker.flags_of.values()) == {("--broker",)} and len(broker.commands) > 20


def test_no_module_reads_a_conveyor_variable_around_the_table() -> None:
    """A setting is read through `config` (`read`, the parser); only the data directory is
    read below it (`locations`, which `config` itself needs), and the example DAG reads its
    own knobs."""
    direct = re.compile(r"""(os\.environ(\.get)?[\[(]|getenv\()\s*["']CONVEYOR_""")
    readers = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
               if direct.search(path.read_text())}
    assert readers <= {"config.py", "locations.py", "scheduler/examples/dags/revenue_dag.py"}
