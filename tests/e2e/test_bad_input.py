"""Bad input gets one clear line: every command, bad values by flag, by variable and by file
key, exit code 2, exactly one line on stderr (naming the setting, the value, what is
allowed), never a traceback. Run as a user runs it: `python -m conveyor.cli` in a fresh
directory with a private data directory.

Services that answer wrongly are this module's own (`Sockets`), on free ports: one that is
taken (`{BUSY}`), one that writes an HTTP error to whoever connects (`{GARBAGE}`), one that
accepts and never says a word (`{SILENT}`). A case names them by placeholder."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.locations import redact
from tests.support import free_port

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
    # a value that starts like a negative number is still the flag's value
    (["worker", "--memory-limit", "-5MiB"], {}, ["--memory-limit", "'-5MiB'", "size"]),
    (["worker", "--time-limit", "-1.5"], {}, ["--time-limit", "'-1.5'", "0 or more"]),
    # a port some other program listens on
    (["worker", "--metrics-port", "{BUSY}"], {}, ["worker's /metrics", ":{BUSY}",
                                                  "in use", "--metrics-port", "free port"]),
    (["scheduler", "--metrics-port", "{BUSY}"], {},
     ["scheduler's /metrics", ":{BUSY}", "in use", "--metrics-port"]),
    (["ui", "--port", "{BUSY}"], {}, ["dashboard", ":{BUSY}", "in use", "--port"]),
    (["autoscaler", "--config", "/dev/null", "--metrics-port", "{BUSY}"], {},
     ["autoscaler's /metrics", ":{BUSY}", "in use", "--metrics-port"]),
    (["up", "--ui-port", "0", "--metrics-port", "{BUSY}"], {},
     ["autoscaler's /metrics", ":{BUSY}", "in use", "--metrics-port"]),
]

#: The command was right but could not be carried out: exit 1, still one line naming the
#: server, what went wrong and what to do; for a one-shot command facing a service it never
#: reached (refused, or a port that never answers), after FIRST_CONTACT_SECONDS.
NO_DB = "postgresql://postgres@127.0.0.1:5432/conveyor_no_such_database"
WRONG_LOGIN = "redis://nouser:pw@127.0.0.1:6379/0"   # WRONGPASS on Redis 7, no config needed
RUNTIME_CASES: list[tuple[list[str], dict[str, str], list[str]]] = [
    # a state store that refuses the connection (libpq's message has two lines)
    (["status", "--state", "postgresql://postgres@127.0.0.1:1/x"], {},
     ["cannot reach the state store", "Is the server running"]),
    # ... or accepts and never answers (libpq waits forever unless told)
    (["status", "--state", "postgresql://postgres@127.0.0.1:{SILENT}/x"], {},
     ["cannot reach the state store", ":{SILENT}", "timeout", "host and port"]),
    # a broker that stays unreachable past its retry window
    (["enqueue", "t", "-b", "redis://127.0.0.1:1/0?retry_seconds=1"], {},
     ["127.0.0.1:1", "1.0 s"]),
    # a broker never reached: a one-shot command gives up at FIRST_CONTACT_SECONDS
    (["status", "-b", "redis://127.0.0.1:{CLOSED}/0"], {},
     ["Redis at redis://127.0.0.1:{CLOSED}/0", "did not answer in 5", "is running"]),
    (["enqueue", "t", "-b", "postgresql://postgres@127.0.0.1:{CLOSED}/postgres"], {},
     ["Postgres broker at", ":{CLOSED}", "did not answer in 5"]),
    (["dead-letters", "list", "-b", "amqp://guest:guest@127.0.0.1:{CLOSED}/%2F"], {},
     ["RabbitMQ at", ":{CLOSED}", "did not answer in 5"]),
    (["status", "-b", "kombu+redis://127.0.0.1:{CLOSED}/0"], {},
     ["kombu broker", ":{CLOSED}", "did not answer in"]),
    # a port that accepts and never answers is unreachable too: each attempt ends at pika's
    # handshake timeout, `stack_timeout=` in the URL (15 s unless told: 33 s for the case)
    (["status", "-b", "amqp://guest:guest@127.0.0.1:{SILENT}/%2F?stack_timeout=2"], {},
     ["RabbitMQ at", ":{SILENT}", "did not answer", "handshake"]),
]


#: A server said no to what the URL names: fix the URL (exit 2, like any bad setting), said
#: at once, with what the server said and what to fix.
REFUSED_CASES: list[tuple[list[str], dict[str, str], list[str]]] = [
    # a service that answers something else
    (["status", "-b", "redis://127.0.0.1:{GARBAGE}/0"], {},
     ["Redis at redis://127.0.0.1:{GARBAGE}/0", "not as Redis does", "Protocol Error",
      "host and port"]),
    (["enqueue", "t", "-b", "redis://127.0.0.1:{GARBAGE}/0"], {}, ["not as Redis does"]),
    (["worker", "-b", "redis://127.0.0.1:{GARBAGE}/0"], {}, ["not as Redis does"]),
    (["limits", "list", "--limits-url", "redis://127.0.0.1:{GARBAGE}/0"], {},
     ["limits store: Redis at", "not as Redis does"]),
    (["status", "-b", "postgresql://postgres@127.0.0.1:{GARBAGE}/postgres"], {},
     ["Postgres broker at", ":{GARBAGE}", "not as Postgres does", "host and port"]),
    # a login refused
    (["limits", "list", "-b", WRONG_LOGIN], {},
     ["limits store: Redis at redis://nouser:***@", "refused this client", "password"]),
    (["status", "-b", WRONG_LOGIN], {}, ["refused this client", "password"]),
    (["worker", "-b", WRONG_LOGIN], {}, ["refused this client", "password"]),
    (["enqueue", "t"], {"CONVEYOR_BROKER_URL": WRONG_LOGIN}, ["refused this client"]),
    (["status", "-b", "amqp://guest:wrong@127.0.0.1:5672/%2F"], {},
     ["RabbitMQ at", "refused the login", "password"]),
    (["status", "-b", "kombu+redis://nouser:pw@127.0.0.1:6379/0"], {},
     ["kombu broker", "refused this client", "password"]),
    (["status", "-b", "kombu+redis://127.0.0.1:{GARBAGE}/0"], {},
     ["kombu broker", "not as Redis does"]),
    # a database that does not exist is a configuration error, not an outage
    (["status", "-b", NO_DB], {},
     ["Postgres broker at", "conveyor_no_such_database", "does not exist", "create it"]),
    (["worker", "-b", NO_DB], {}, ["conveyor_no_such_database", "does not exist"]),
    (["limits", "list", "--limits-url", NO_DB], {},
     ["limits store: Postgres at", "does not exist", "create it"]),
    (["status", "--state", NO_DB], {}, ["state store", "does not exist"]),
]


class Sockets:
    """Listening sockets of this module's own on free ports of 127.0.0.1, each answering
    the connections it accepts its own way; closed (every connection too) by `close()`."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.ports = {"CLOSED": self._closed(),
                      "BUSY": self._listen(None),
                      "GARBAGE": self._listen(b"HTTP/1.1 400 Bad Request\r\n"
                                              b"Content-Length: 0\r\n\r\n"),
                      "SILENT": self._listen(b"")}

    def _listen(self, answer: bytes | None) -> int:
        """A listener; `answer` is written to each connection (None: nobody accepts)."""
        server = socket.create_server(("127.0.0.1", 0))
        self._open.append(server)
        if answer is not None:
            thread = threading.Thread(target=self._serve, args=(server, answer), daemon=True)
            thread.start()
            self._threads.append(thread)
        return int(server.getsockname()[1])

    @staticmethod
    def _closed() -> int:
        """A free port nothing listens on (connections to it are refused): one no other
        test is handed meanwhile, nor any connection (tests/support.py `free_port`)."""
        return free_port()

    def _serve(self, server: socket.socket, answer: bytes) -> None:
        server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            self._open.append(conn)   # kept open: the client sees no EOF, only the answer
            if answer:
                conn.sendall(answer)

    def fill(self, text: str) -> str:
        for name, number in self.ports.items():
            text = text.replace(f"{{{name}}}", str(number))
        return text

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for sock in self._open:
            sock.close()


@pytest.fixture(scope="module")
def sockets() -> Iterator[Sockets]:
    opened = Sockets()
    yield opened
    opened.close()


def filled(sockets: Sockets, argv: list[str], env: dict[str, str],
           words: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """A case with its placeholders replaced by the sockets' ports."""
    return ([sockets.fill(a) for a in argv], {k: sockets.fill(v) for k, v in env.items()},
            [sockets.fill(w) for w in words])


def conveyor(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return subprocess.run([sys.executable, "-m", "conveyor.cli", *argv], cwd=cwd, text=True,
                          capture_output=True, timeout=60,
                          env={**clean, "CONVEYOR_HOME": str(cwd / "data"), **env})


#: A daemon's log line below ERROR (what it says as it starts, e.g. who its tasks run as).
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING) ")


def assert_one_line(done: subprocess.CompletedProcess[str], words: list[str],
                    code: int = 2) -> None:
    """Exactly one line on stderr says what is wrong (a daemon's own log lines below ERROR
    aside), the exit code is `code`, and no traceback."""
    err = done.stderr
    assert "Traceback" not in err, err
    said = "".join(line for line in err.splitlines(keepends=True) if not LOG_LINE.match(line))
    assert done.returncode == code and said.count("\n") == 1 and said.endswith("\n"), err
    assert all(word in said for word in words), (words, err)


@pytest.mark.parametrize(("argv", "env", "words"), CASES,
                         ids=[" ".join(a) + "".join(f" {k}={v}" for k, v in e.items())
                              for a, e, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], env: dict[str, str],
                                          words: list[str], tmp_path: Path,
                                          sockets: Sockets) -> None:
    argv, env, words = filled(sockets, argv, env, words)
    assert_one_line(conveyor(argv, env, tmp_path), words)


@pytest.mark.parametrize(("argv", "env", "words"), RUNTIME_CASES,
                         ids=[" ".join(a) + "".join(f" {k}" for k in e)
                              for a, e, _ in RUNTIME_CASES])
def test_a_failure_at_run_time_is_one_line_and_exit_1(argv: list[str], env: dict[str, str],
                                                      words: list[str], tmp_path: Path,
                                                      sockets: Sockets) -> None:
    argv, env, words = filled(sockets, argv, env, words)
    started = time.monotonic()
    done = conveyor(argv, env, tmp_path)
    assert_one_line(done, words, code=1)
    if "did not answer in 5" in words:   # never reached: said in seconds, not retry_seconds
        assert time.monotonic() - started < 30, done.stderr


@pytest.mark.parametrize(("argv", "env", "words"), REFUSED_CASES,
                         ids=[" ".join(a) + "".join(f" {k}" for k in e)
                              for a, e, _ in REFUSED_CASES])
def test_a_server_that_refuses_the_url_is_one_line_at_once_and_exit_2(
        argv: list[str], env: dict[str, str], words: list[str], tmp_path: Path,
        sockets: Sockets) -> None:
    argv, env, words = filled(sockets, argv, env, words)
    started = time.monotonic()
    done = conveyor(argv, env, tmp_path)
    assert_one_line(done, words, code=2)
    assert time.monotonic() - started < 15, done.stderr   # not retried as an outage


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
        assert_one_line(conveyor(argv, {}, tmp_path), words)
    (tmp_path / "conveyor.toml").unlink()
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(file + "\n")
    assert_one_line(conveyor(["worker"], {"CONVEYOR_CONFIG_FILE": str(elsewhere)}, tmp_path),
                    [w.replace("conveyor.toml", "elsewhere.toml") for w in words])


def test_the_worker_takes_a_file_that_holds_other_commands_keys(tmp_path: Path) -> None:
    """One file serves every command: a key the worker has no use for is not a misspelling."""
    (tmp_path / "conveyor.toml").write_text('dags_folder = "dags"\nui_port = 8081\n'
                                            "concurrency = 1\n")
    done = conveyor(["worker", "--burst", "--log-level", "ERROR"], {}, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr


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


#: Every daemon, as a user starts it, with a broker that nothing answers at (Redis; the
#: worker on every transport).
NOWHERE = "redis://127.0.0.1:{CLOSED}/0"
DAEMONS: list[tuple[list[str], str]] = [
    (["worker", "-Q", "q", "-c", "1"], NOWHERE),
    (["scheduler"], NOWHERE),
    (["autoscaler", "--config", "{TMP}/autoscaler.toml"], NOWHERE),
    (["ui", "--port", "0"], NOWHERE),
    (["up", "--metrics-port", "0", "--ui-port", "0", "--max-workers", "1"], NOWHERE),
    (["worker", "-Q", "q", "-c", "1"], "postgresql://postgres@127.0.0.1:{CLOSED}/postgres"),
    (["worker", "-Q", "q", "-c", "1"], "amqp://guest:guest@127.0.0.1:{CLOSED}/%2F"),
    (["worker", "-Q", "q", "-c", "1"], "kombu+redis://127.0.0.1:{CLOSED}/0"),
]


@pytest.mark.parametrize(("argv", "url"), DAEMONS,
                         ids=[f"{a[0]} {u.split(':', 1)[0]}" for a, u in DAEMONS])
def test_a_daemon_that_never_reached_its_broker_says_so_in_seconds_and_keeps_trying(
        argv: list[str], url: str, tmp_path: Path, sockets: Sockets) -> None:
    """Issue 26: the one clear line came after 62 s. Now within FIRST_CONTACT_SECONDS (5 s,
    20 s allowed under load), once, at ERROR; the daemon keeps trying (retry_seconds)."""
    (tmp_path / "autoscaler.toml").write_text("metrics_port = 0\n")
    url = sockets.fill(url)
    argv = [a.replace("{TMP}", str(tmp_path)) for a in argv]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    proc = subprocess.Popen([sys.executable, "-m", "conveyor.cli", *argv, "-b", url],
                            cwd=tmp_path, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env={**clean, "CONVEYOR_HOME": str(tmp_path / "data")})
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda out: lines.extend(iter(out.readline, "")),
                              args=(proc.stderr,), daemon=True)
    started = time.monotonic()
    reader.start()
    try:
        while not any("has not answered yet" in line for line in lines):
            assert time.monotonic() - started < 20, lines
            assert proc.poll() is None, lines
            time.sleep(0.1)
        said = [line for line in lines if "has not answered yet" in line]
        assert redact(url) in said[0] and " ERROR " in said[0], said
        assert "still trying" in said[0] and "is running" in said[0], said
        assert not any("Traceback" in line for line in lines), lines
        time.sleep(1.0)
        assert proc.poll() is None, lines   # still trying
    finally:
        os.killpg(proc.pid, signal.SIGTERM)   # up's scheduler and workers too
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        reader.join(timeout=5)
        if proc.stderr is not None:
            proc.stderr.close()


def test_a_daemon_given_a_password_on_its_command_line_warns_at_start(tmp_path: Path) -> None:
    """argv is /proc/<pid>/cmdline, readable by every process of the host, tasks included
    (README: Security model): the worker says so and where to put the URL instead."""
    flag = conveyor(["worker", "-Q", "q", "-b", WRONG_LOGIN], {}, tmp_path)
    [warning] = [line for line in flag.stderr.splitlines() if "password on the command" in line]
    assert " WARNING " in warning and "--broker" in warning, flag.stderr
    assert "CONVEYOR_BROKER_URL" in warning and "broker_url" in warning, flag.stderr
    assert "pw" not in warning.replace("password", ""), warning   # never the password itself
    for argv, env in ((["worker", "-Q", "q"], {"CONVEYOR_BROKER_URL": WRONG_LOGIN}),
                      (["status", "-b", WRONG_LOGIN], {})):   # one-shot: gone in a moment
        quiet = conveyor(argv, env, tmp_path)
        assert quiet.returncode == 2 and "password on the command" not in quiet.stderr, \
            quiet.stderr


def test_a_result_store_that_answers_wrongly_is_one_line_under_enqueue_wait(
        tmp_path: Path, sockets: Sockets) -> None:
    """`enqueue --wait` says which message it enqueued (stderr), then the one error line."""
    for url, words, code in ((f"redis://127.0.0.1:{sockets.ports['GARBAGE']}/0",
                              ["result store: Redis at", "not as Redis does"], 2),
                             (WRONG_LOGIN, ["result store: Redis at", "refused this client"], 2),
                             (f"redis://127.0.0.1:{sockets.ports['CLOSED']}/0",
                              ["result store: Redis at", "is unreachable", "is running"], 1)):
        done = conveyor(["enqueue", "t", "--wait"], {"CONVEYOR_RESULT_URL": url}, tmp_path)
        enqueued, error = done.stderr.splitlines()
        assert enqueued.startswith("conveyor: enqueued "), done.stderr
        done.stderr = error + "\n"
        assert_one_line(done, words, code=code)
