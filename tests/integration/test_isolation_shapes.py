"""Each deployment shape, run for real: what a hostile task can reach of its own worker.

The README's "Security model" table says, per shape, what a task can do to the worker's
processes (supervisor, zygote, lanes, sibling runners). Here a real worker runs in each
shape on a real broker, and a task (`iso.probe`) tries environ, mem, PTRACE_ATTACH, fd, cwd,
signals and prlimit on every other process of that worker, and rewriting its own memory
cap. The assertions are that table, row by row.

Shapes: root with --uid (Redis), root without --uid (SQLite), not root without --uid (SQLite,
started as uid 65534 the way the Dockerfile's USER starts it). The last needs an interpreter
that uid can exec and a tree it can read; where there is none it skips (fails in CI).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.broker import Broker, from_url
from conveyor.client import Client
from conveyor.events import Event
from conveyor.message import Message
from tests.conftest import REDIS_URL, delete_redis_prefix

ROOT = Path(__file__).parents[2]
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
CLOSED = {"environ": ["EACCES"], "mem": ["EACCES"], "ptrace": ["EPERM"], "fd": ["EACCES"],
          "cwd": ["EACCES"]}
OPEN = dict.fromkeys(("environ", "mem", "ptrace", "fd", "cwd", "signal", "prlimit"), ["ok"])
ROLES = ("supervisor", "zygote", "lane", "runner")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the shapes start workers as root "
                                "and as another uid")


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every uid of the test can use (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="conveyor-shape-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(broker_url: str, home: Path, pythonpath: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update({"CONVEYOR_BROKER_URL": broker_url, "PYTHONPATH": pythonpath, "HOME": str(home),
                "API_TOKEN": f"s3cret-{uuid.uuid4().hex}", "CONVEYOR_LOG_LEVEL": "INFO"})
    return env


def _run_worker(broker: Broker, broker_url: str, queue: str, shared: Path, *flags: str,
                prefix: tuple[str, ...] = (), python: str = sys.executable,
                pythonpath: str = f"{ROOT}/src:{ROOT}") -> tuple[dict[str, Any], str]:
    """A burst worker with a sleeping task and the probe; the probe's report and the log."""
    argv = [*prefix, python, "-m", "conveyor.cli", "worker", f"--queues={queue}",
            "--app=tests.integration.isolation_probe", "--concurrency=2", "--burst",
            "--heartbeat-interval=1", *flags]
    marker = shared / f"{queue}.sleeping"
    client = Client(broker)
    client.enqueue(Message(queue=queue, task="iso.sleep", args=(30, str(marker))))
    _give_to_nobody(shared)
    proc = subprocess.Popen(argv, cwd=shared, env=_env(broker_url, shared, pythonpath),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client.enqueue(Message(queue=queue, task="iso.probe", args=(proc.pid, str(marker)),
                           reply_to=f"{queue}-r", max_retries=0))
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = [e for e in _events(broker, f"{queue}-r") if e.kind in ("succeeded", "failed")]
    assert [e.kind for e in done] == ["succeeded"], out
    return done[0].result, out


def _events(broker: Broker, queue: str) -> Iterator[Event]:
    for delivery in broker.consume([queue], prefetch=64, timeout=0.5):
        if delivery is None:
            return
        broker.ack(delivery)
        yield Event.decode(delivery.body)


def _give_to_nobody(path: Path) -> None:
    """The SQLite files the test created as root must be the worker's in the non-root shape."""
    for entry in [path, *path.rglob("*")]:
        os.chown(entry, NOBODY, NOBODY)


def _assert_roles(report: dict[str, Any], expected: dict[str, dict[str, list[str]]],
                  out: str) -> None:
    assert set(report["roles"]) == set(ROLES), out
    for role in ROLES:
        got = {check: sorted(report["roles"][role][check]) for check in expected[role]}
        assert got == expected[role], f"{role}: {got}\n{out}"


def test_root_with_uid_closes_everything_but_same_uid_siblings_signals(shared: Path) -> None:
    """Root worker, --uid nobody (no --gid: nobody's primary group), on Redis."""
    prefix = f"shape{uuid.uuid4().hex[:10]}"
    url = f"{REDIS_URL}?prefix={prefix}"
    broker = from_url(url)
    try:
        report, out = _run_worker(broker, url, "q", shared, "--uid=nobody")
    finally:
        broker.close()
        delete_redis_prefix(prefix)
    assert report["uid"] == NOBODY, out
    walled = {**CLOSED, "signal": ["EPERM"], "prlimit": ["EPERM"]}
    # idle runners are still root; the running sibling is nobody, like the probe
    siblings = {**CLOSED, "signal": ["EPERM", "ok"], "prlimit": ["EPERM", "ok"]}
    _assert_roles(report, {"supervisor": walled, "zygote": walled, "lane": walled,
                           "runner": siblings}, out)
    assert report["cgroup_cap"] != "ok", out
    assert "tasks run as" not in out, out


def test_root_without_uid_hides_nothing_and_says_so(shared: Path) -> None:
    url = f"sqlite:///{shared}/broker.db"
    broker = from_url(url)
    try:
        report, out = _run_worker(broker, url, "q", shared)
    finally:
        broker.close()
    assert report["uid"] == 0, out
    _assert_roles(report, dict.fromkeys(ROLES, OPEN), out)
    assert report["cgroup_cap"] in ("ok", "none"), out  # root may raise its own cap
    assert "tasks run as root: nothing of the worker is hidden from them" in out, out


def test_not_root_without_uid_closes_memory_and_environ_but_not_signals(shared: Path) -> None:
    """The Dockerfile's shape: the worker itself runs as an unprivileged uid."""
    python, pythonpath = _interpreter_for_nobody(shared)
    url = f"sqlite:///{shared}/broker.db"
    broker = from_url(url)
    try:
        report, out = _run_worker(broker, url, "q", shared, "--memory-limit=1GiB",
                                  prefix=tuple(AS_NOBODY), python=python,
                                  pythonpath=pythonpath)
    finally:
        broker.close()
    assert report["uid"] == NOBODY, out
    same_uid = {**CLOSED, "signal": ["ok"], "prlimit": ["ok"]}
    _assert_roles(report, dict.fromkeys(ROLES, same_uid), out)
    assert report["cgroup_cap"] != "ok", out
    assert report["rlimit_cap"] == "EPERM", out  # the fallback's cap is a hard limit
    assert "tasks run as this worker's uid 65534" in out, out
    assert "task memory caps fall back to RLIMIT_AS" in out, out  # no cgroups for non-root


def _interpreter_for_nobody(shared: Path) -> tuple[str, str]:
    """A Python that uid 65534 can exec (as the supervisor execs the zygote) and import with.

    A venv whose base interpreter lives under a root-only home (pyenv in /root) cannot be
    exec'd by another uid; the system interpreter of the same version can, with this tree
    and the venv's site-packages on PYTHONPATH.
    """
    paths = [f"{ROOT}/src", str(ROOT), *site.getsitepackages()]
    pythonpath = ":".join(paths)
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    check = ("import subprocess, sys; import conveyor.worker.supervisor, "
             "tests.integration.isolation_probe; subprocess.run([sys.executable, '-c', "
             "'import conveyor.worker.zygote'], check=True)")
    tried = []
    for python in dict.fromkeys([sys.executable, f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"]):
        if not shutil.which("setpriv") or not Path(python).exists():
            continue
        done = subprocess.run([*AS_NOBODY, python, "-c", check], cwd=shared, text=True,
                              capture_output=True, env={"PYTHONPATH": pythonpath,
                                                        "HOME": str(shared)})
        if done.returncode == 0:
            return python, pythonpath
        tried.append(f"{python}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    _unavailable(f"no Python that uid {NOBODY} can exec and import conveyor with "
                 f"(needs setpriv): {'; '.join(tried) or 'none found'}")
    raise AssertionError("unreachable")


def test_a_uid_without_a_passwd_entry_needs_a_gid_and_says_so_at_start(shared: Path) -> None:
    url = f"sqlite:///{shared}/broker.db"
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "worker", "--queues=q",
                           "--burst", "--uid=48213"], cwd=shared, text=True,
                          capture_output=True, env=_env(url, shared, f"{ROOT}/src:{ROOT}"),
                          timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--uid 48213 has no passwd entry" in lines[0], done.stderr


def test_a_runner_that_cannot_drop_privileges_says_why(shared: Path) -> None:
    """Root without CAP_SETUID/CAP_SETGID (a container with dropped capabilities)."""
    url = f"sqlite:///{shared}/broker.db"
    broker = from_url(url)
    try:
        Client(broker).enqueue(Message(queue="q", task="iso.sleep", args=(0, "/dev/null"),
                                       reply_to="q-r", max_retries=0))
        capless = ["setpriv", "--bounding-set=-setuid,-setgid", "--inh-caps=-setuid,-setgid"]
        done = subprocess.run([*capless, sys.executable, "-m", "conveyor.cli", "worker",
                               "--queues=q", "--app=tests.integration.isolation_probe",
                               "--burst", "--uid=nobody"], cwd=shared, text=True,
                              capture_output=True, env=_env(url, shared, f"{ROOT}/src:{ROOT}"),
                              timeout=90)
        [dead] = broker.dead_letters("q")
    finally:
        broker.close()
    assert "cannot isolate itself: cannot drop to uid 65534" in dead.reason, done.stderr
    assert "failed with EPERM" in dead.reason, done.stderr


def test_a_python_the_worker_cannot_exec_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote is exec'd with the worker's interpreter: if that fails, say so plainly."""
    from conveyor.errors import ConfigError
    from conveyor.worker import cgroups
    from conveyor.worker.pool import Pool

    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    caps = cgroups.detect(force="rlimit")
    try:
        with pytest.raises(ConfigError, match="cannot start the runner zygote with "
                           "/nonexistent/python3: No such file or directory"):
            Pool([], {}, lambda: None, caps)
    finally:
        caps.close()


def test_a_worker_that_may_not_read_its_home_says_so_in_one_line(shared: Path) -> None:
    """Started as nobody with root's HOME (an inherited environment): one line, no traceback."""
    python, pythonpath = _interpreter_for_nobody(shared)
    roots_home = shared / "root-home"
    roots_home.mkdir(mode=0o700)
    env = _env(f"sqlite:///{shared}/broker.db", roots_home, pythonpath)
    env.pop("XDG_DATA_HOME", None)
    done = subprocess.run([*AS_NOBODY, python, "-m", "conveyor.cli", "worker", "--burst"],
                          cwd=shared, env=env, text=True, capture_output=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "permission denied for uid 65534; set CONVEYOR_HOME" in lines[0], done.stderr


def test_uid_0_is_the_root_shape_and_says_so(shared: Path) -> None:
    url = f"sqlite:///{shared}/broker.db"
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "worker", "--queues=q",
                           "--burst", "--uid=root"], cwd=shared, text=True,
                          capture_output=True, env=_env(url, shared, f"{ROOT}/src:{ROOT}"),
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tasks run as root: nothing of the worker is hidden from them" in done.stderr
