"""Bad input gets one clear line: every command, bad values by flag, by variable and by file
key, exit code 2, exactly one line on stderr (naming the setting, the value, what is
allowed), never a traceback. Run as a user runs it: `python -m conveyor.cli` in a fresh
directory with a private data directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

NOT_A_PORT = "redis://localhost:notaport/11"

#: (command line, environment, words the one line must contain)
CASES: list[tuple[list[str], dict[str, str], list[str]]] = [
    # worker
    (["worker", "-c", "-1"], {}, ["--concurrency", "'-1'", "1 or more"]),
    (["worker", "--time-limit", "-1"], {}, ["--time-limit", "'-1'", "0 or more"]),
    (["worker", "--heartbeat-interval", "-5"], {}, ["--heartbeat-interval", "more than 0"]),
    (["worker", "--heartbeat-interval", "0"], {}, ["--heartbeat-interval", "more than 0"]),
    (["worker", "-b", NOT_A_PORT], {}, ["--broker", "notaport", "not a number"]),
    (["worker", "--memory-limit", "lots"], {}, ["--memory-limit", "'lots'", "512MiB"]),
    (["worker", "--max-memory-per-child", "200000"], {}, ["KiB", "--memory-limit"]),
    (["worker", "--log-level", "loud"], {}, ["--log-level", "'loud'", "INFO"]),
    (["worker", "--metrics-port", "70000"], {}, ["--metrics-port", "65535"]),
    (["worker", "--drain-timeout", "soon"], {}, ["--drain-timeout", "'soon'", "seconds"]),
    (["worker"], {"CONVEYOR_CONCURRENCY": "-1"}, ["CONVEYOR_CONCURRENCY", "'-1'", "1 or more"]),
    (["worker"], {"CONVEYOR_TIME_LIMIT": "-1"}, ["CONVEYOR_TIME_LIMIT", "0 or more"]),
    (["worker"], {"CONVEYOR_HEARTBEAT_INTERVAL": "-5"}, ["CONVEYOR_HEARTBEAT_INTERVAL"]),
    (["worker"], {"CONVEYOR_BROKER_URL": NOT_A_PORT}, ["CONVEYOR_BROKER_URL", "notaport"]),
    (["worker"], {"CONVEYOR_MAX_MEMORY_PER_CHILD": "200000"}, ["KiB", "--memory-limit"]),
    (["worker"], {"CONVEYOR_MEMORY_LIMIT": "-1"}, ["CONVEYOR_MEMORY_LIMIT", "'-1'"]),
    (["worker", "--no-such-flag"], {}, ["unrecognized arguments", "--no-such-flag"]),
    # limits
    (["limits", "set", "api", "--max", "0"], {}, ["--max", "'0'", "1 or more"]),
    (["limits", "set", "api", "--per-second", "-1"], {}, ["--per-second", "'-1'"]),
    (["limits", "set", "api"], {}, ["--max", "--per-second"]),
    (["limits", "list"], {"CONVEYOR_LIMITS_URL": "amqp://h/"}, ["amqp", "redis://"]),
    # scheduler, autoscaler, up
    (["scheduler", "--local-slots", "0"], {}, ["--local-slots", "1 or more"]),
    (["scheduler"], {"CONVEYOR_LOCAL_SLOTS": "four"}, ["CONVEYOR_LOCAL_SLOTS", "'four'"]),
    (["scheduler", "--kubernetes-pending-timeout", "-1"], {}, ["--kubernetes-pending-timeout"]),
    (["scheduler", "--state", "postgresql://h:port/db"], {}, ["--state", "'h:port'"]),
    (["autoscaler", "--metrics-port", "-1"], {}, ["--metrics-port", "65535"]),
    (["autoscaler"], {"CONVEYOR_AUTOSCALER_METRICS_PORT": "x"},
     ["CONVEYOR_AUTOSCALER_METRICS_PORT", "port number"]),
    (["up", "--max-workers", "0"], {}, ["--max-workers", "1 or more"]),
    (["up", "-c", "0"], {}, ["--concurrency", "1 or more"]),
    (["up"], {"CONVEYOR_UP_MAX_WORKERS": "-3"}, ["CONVEYOR_UP_MAX_WORKERS", "'-3'"]),
    (["up"], {"CONVEYOR_LOG_LEVEL": "chatty"}, ["CONVEYOR_LOG_LEVEL", "'chatty'"]),
    # clients and operator commands
    (["enqueue", "t", "--priority", "-1"], {}, ["--priority", "0 or more"]),
    (["enqueue", "t", "--delay", "-1"], {}, ["--delay", "0 or more"]),
    (["enqueue", "t", "--args", "{"], {}, ["--args", "not JSON"]),
    (["enqueue", "t"], {"CONVEYOR_BROKER_URL": NOT_A_PORT}, ["CONVEYOR_BROKER_URL"]),
    (["status", "--runs", "-1"], {}, ["--runs", "0 or more"]),
    (["status", "-b", "nourl"], {}, ["--broker", "'nourl'", "must be a URL"]),
    (["status"], {"CONVEYOR_STATE_URL": "sqlite://x:y/z"}, ["CONVEYOR_STATE_URL", "'x:y'"]),
    (["dead-letters", "list", "--limit", "0"], {}, ["--limit", "1 or more"]),
    (["runs", "list", "--limit", "many"], {}, ["--limit", "'many'", "whole number"]),
    (["runs", "show", "R", "-b", NOT_A_PORT], {}, ["--broker", "notaport"]),
    (["tasks", "show", "R", "T", "--state", "x:/y"], {}, ["--state", "must be a URL"]),
    (["dags", "list", "-b", NOT_A_PORT], {}, ["--broker", "notaport"]),
    (["dags", "trigger", "d", "--logical-date", "yesterday"], {}, ["--logical-date", "ISO"]),
    (["submit", "t", "--retries", "-1"], {}, ["--retries", "0 or more"]),
    (["submit", "t", "--memory-limit", "lots"], {}, ["--memory-limit", "'lots'"]),
    (["submit", "t", "--time-limit", "-2"], {}, ["--time-limit", "0 or more"]),
    (["config", "show"], {"CONVEYOR_CONCURRENCY": "zero"}, ["CONVEYOR_CONCURRENCY"]),
    (["config", "show", "worker", "-c", "0"], {}, ["--concurrency", "1 or more"]),
    (["demo", "--count", "0"], {}, ["--count", "1 or more"]),
    (["no-such-command"], {}, ["invalid choice", "'no-such-command'"]),
    (["worker"], {"CONVEYOR_MAX_MESSAGE_BYTES": "-1"}, ["CONVEYOR_MAX_MESSAGE_BYTES", "size"]),
    (["scheduler"], {"CONVEYOR_RESULT_TTL": "0"}, ["CONVEYOR_RESULT_TTL", "more than 0"]),
    (["status", "-b", "kombu+nope://x"], {}, ["kombu has no transport 'nope'"]),
    (["worker", "-b", "redis://127.0.0.1:6379/notadb"], {}, ["--broker", "'notadb'", "number"]),
]

#: The command was right but could not be carried out: exit 1, still one line.
RUNTIME_CASES: list[tuple[list[str], dict[str, str], list[str]]] = [
    # a state store that refuses the connection (libpq's message has two lines)
    (["status", "--state", "postgresql://postgres@127.0.0.1:1/x"], {},
     ["cannot reach the state store", "Is the server running"]),
    # a broker that stays unreachable past its retry window
    (["enqueue", "t", "-b", "redis://127.0.0.1:1/0?retry_seconds=1"], {},
     ["127.0.0.1:1", "1.0 s"]),
]


def conveyor(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in __import__("os").environ.items() if not k.startswith("CONVEYOR_")}
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], cwd=cwd, text=True,
                          capture_output=True, timeout=60,
                          env={**clean, "CONVEYOR_HOME": str(cwd / "data"), **env})


def assert_one_line(done: subprocess.CompletedProcess[str], words: list[str],
                    code: int = 2) -> None:
    err = done.stderr
    assert "Traceback" not in err, err
    assert done.returncode == code and err.count("\n") == 1 and err.endswith("\n"), err
    assert all(word in err for word in words), (words, err)


@pytest.mark.parametrize(("argv", "env", "words"), CASES,
                         ids=[" ".join(a) + "".join(f" {k}={v}" for k, v in e.items())
                              for a, e, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], env: dict[str, str],
                                          words: list[str], tmp_path: Path) -> None:
    assert_one_line(conveyor(argv, env, tmp_path), words)


@pytest.mark.parametrize(("argv", "env", "words"), RUNTIME_CASES,
                         ids=[" ".join(a) for a, _, _ in RUNTIME_CASES])
def test_a_failure_at_run_time_is_one_line_and_exit_1(argv: list[str], env: dict[str, str],
                                                      words: list[str], tmp_path: Path) -> None:
    done = conveyor(argv, env, tmp_path)
    *attempts, last = done.stderr.splitlines() or [""]
    assert all("reconnecting in" in line for line in attempts), done.stderr  # one per attempt
    done.stderr = last + "\n"   # the error itself: one line after the attempts' lines
    assert_one_line(done, words, code=1)


@pytest.mark.parametrize(("file", "words"), [
    ("concurrency = -1", ["conveyor.toml: concurrency", "'-1'", "1 or more"]),
    ("heartbeat_interval = 0", ["conveyor.toml: heartbeat_interval", "more than 0"]),
    ('broker_url = "redis://localhost:notaport/11"', ["conveyor.toml: broker_url", "notaport"]),
    ("max_memory_per_child = 200000", ["conveyor.toml: max_memory_per_child", "KiB"]),
    ("concurency = 4", ["concurency", "not a setting"]),
])
def test_a_bad_file_key_is_one_line_for_every_command(file: str, words: list[str],
                                                      tmp_path: Path) -> None:
    (tmp_path / "conveyor.toml").write_text(file + "\n")
    for argv in (["worker"], ["status"], ["config", "show"]):
        if argv == ["worker"] and "not a setting" in words:
            continue   # the worker's lean parser knows only its own keys
        assert_one_line(conveyor(argv, {}, tmp_path), words)


def test_the_old_memory_flag_still_works_with_one_deprecation_line(tmp_path: Path) -> None:
    for argv, env in ((["config", "show", "worker", "--max-memory-per-child=1GiB"], {}),
                      (["config", "show"], {"CONVEYOR_MAX_MEMORY_PER_CHILD": "1GiB"})):
        done = conveyor(argv, env, tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("\n") == 1 and "deprecated" in done.stderr, done.stderr
        assert "memory-limit" in done.stderr.lower().replace("_", "-"), done.stderr
        [row] = [line for line in done.stdout.splitlines() if line.startswith("memory_limit ")]
        assert str(1024**3) in row.split(), row


def test_the_new_memory_flag_is_a_hard_cap_in_bytes_or_with_a_unit(tmp_path: Path) -> None:
    done = conveyor(["config", "show", "worker", "--memory-limit=200MiB"], {}, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    [row] = [line for line in done.stdout.splitlines() if line.startswith("memory_limit ")]
    assert str(200 * 1024**2) in row.split() and "flag" in row.split(), row
