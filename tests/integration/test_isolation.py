"""Task isolation on a real kernel: memory cgroups, the rlimit fallback, non-dumpable runners.

Real forks, real cgroups, real uids; no mocks. Tests that need root or a writable memory
cgroup skip on a machine without them and fail in CI (`CI=true`), saying what is missing.
Every child is forked by the test, reaped by pid, and killed by pid if a test fails early.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.worker import cgroups, isolation

MiB = 1 << 20
NOBODY = 65534


def _unavailable(message: str) -> None:
    """Skip on a developer machine; fail in CI, which must never pass by skipping."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _require_root(why: str) -> None:
    if os.geteuid() != 0:
        _unavailable(f"needs root ({why}); this test runs as uid {os.geteuid()}")


@pytest.fixture
def caps() -> Iterator[cgroups.MemoryCaps]:
    """Real cgroup memory caps, closed (and checked to leave nothing behind) after the test."""
    found = cgroups.detect()
    if found.kind == "rlimit":
        found.close()
        _unavailable(f"no writable memory cgroup here: {found.describe()}")
    yield found
    found.close()
    assert not found.group.exists(), f"{found.group} left behind"  # type: ignore[attr-defined]


@pytest.fixture
def children() -> Iterator[list[int]]:
    """Pids this test forked; any still running at the end are SIGKILLed and reaped."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            continue


def _fork(body: Callable[[], int | None], children: list[int]) -> int:
    """Fork a child that runs `body` and exits with its return value (70 if it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = body() or 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    children.append(pid)
    return pid


def _wait(pid: int, timeout: float = 30.0) -> int:
    """Reap `pid`; its exit code, or minus the signal that killed it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    raise AssertionError(f"child {pid} still running after {timeout}s")


def _allocate(mib: int) -> list[bytearray]:
    """Allocate `mib` MiB and write to every page, so it is resident, not just reserved."""
    chunks = []
    for _ in range(mib):
        chunk = bytearray(MiB)
        chunk[::4096] = b"\x01" * (MiB // 4096)
        chunks.append(chunk)
    return chunks


def _await_byte(fd: int, timeout: float = 30.0) -> bytes:
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, f"no word from the child within {timeout}s"
    return os.read(fd, 1)


# -- memory caps -------------------------------------------------------------------------------


def test_task_over_its_cap_is_oom_killed_alone_in_its_cgroup(
        caps: cgroups.MemoryCaps, children: list[int]) -> None:
    """Scenario 1: the rogue task dies inside its own cgroup; its sibling and we carry on."""
    rogue = caps.prepare(f"rogue-{uuid.uuid4().hex[:8]}", 64 * MiB)
    calm = caps.prepare(f"calm-{uuid.uuid4().hex[:8]}", 64 * MiB)
    ready_r, ready_w = os.pipe()
    finish_r, finish_w = os.pipe()

    def sibling() -> int:
        calm.enter()
        held = _allocate(16)
        os.write(ready_w, b"r")
        os.read(finish_r, 1)  # stay alive, holding memory, until the rogue was killed
        return 0 if len(held) == 16 else 1

    def hog() -> int:
        rogue.enter()
        _allocate(128)  # twice the cap
        return 3  # reaching this line means the cap did not hold

    try:
        calm_pid = _fork(sibling, children)
        assert _await_byte(ready_r) == b"r"
        rogue_status = _wait(_fork(hog, children))
        os.write(finish_w, b"f")
        calm_status = _wait(calm_pid)
    finally:
        for fd in (ready_r, ready_w, finish_r, finish_w):
            os.close(fd)

    assert rogue_status == -signal.SIGKILL, f"the rogue task ended with {rogue_status}"
    outcome = rogue.outcome()
    assert outcome.oom_killed, f"its cgroup recorded no OOM kill: {outcome}"
    assert outcome.oom_kills is not None and outcome.oom_kills >= 1
    assert rogue.oom_kills() == outcome.oom_kills  # the pool's per-task read: counter only
    assert outcome.peak_bytes is None or outcome.peak_bytes <= 64 * MiB + MiB
    assert calm_status == 0
    assert calm.outcome().oom_killed is False
    assert calm.oom_kills() in (0, None)
    rogue.remove()
    calm.remove()


def test_rlimit_fallback_fails_allocation_with_memory_error_and_warns_once(
        caplog: pytest.LogCaptureFixture, children: list[int]) -> None:
    cgroups.reset_fallback_warning()
    caplog.set_level(logging.WARNING, logger="conveyor.worker.cgroups")
    with cgroups.detect(force="rlimit") as caps, cgroups.detect(force="rlimit") as again:
        assert caps.kind == again.kind == "rlimit"
        slot = caps.prepare("rlimit-task", 64 * MiB)

        def task() -> int:
            slot.enter()
            _allocate(8)  # well within the cap: still works
            try:
                bytearray(256 * MiB)
            except MemoryError:
                return 0
            return 3

        assert _wait(_fork(task, children)) == 0, "the over-cap allocation did not fail"
        assert slot.outcome().oom_killed is False  # no kill under rlimit: the task saw an error
        slot.remove()

    warnings = [r.getMessage() for r in caplog.records
                if r.name == "conveyor.worker.cgroups" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    for plain_words in ("RLIMIT_AS", "virtual address space, not its resident memory",
                        "MemoryError", "instead of an OOM kill", "root",
                        "delegated cgroup v2 subtree"):
        assert plain_words in warnings[0]


def test_limits_can_be_set_lowered_and_lifted(caps: cgroups.MemoryCaps) -> None:
    """Writing order matters on v1 (memsw >= memory at every instant): every step succeeds."""
    slot = caps.prepare(f"limits-{uuid.uuid4().hex[:8]}", 0)
    assert slot.path is not None
    cap = slot.path / ("memory.max" if caps.kind == "cgroup2" else "memory.limit_in_bytes")
    for limit in (64 * MiB, 32 * MiB, 256 * MiB, 0):
        slot.set_limit(limit)
        written = cap.read_text().strip()
        if limit:
            assert written == str(limit)
        else:  # no cap: "max" on v2, the largest page-aligned value on v1
            assert written == "max" or int(written) >= 2**62
    slot.remove()
    with pytest.raises(cgroups.CgroupError, match="not allowed"):
        caps.prepare("../escape", MiB)
    with pytest.raises(cgroups.CgroupError, match="negative"):
        caps.prepare("negative", -1)


def test_an_unreadable_oom_counter_is_an_error_naming_the_cgroup(
        caps: cgroups.MemoryCaps) -> None:
    """A cgroup removed behind the worker's back: the per-task OOM check must say so, not
    report "no OOM kill" (the supervisor would then call a killed task a success)."""
    slot = caps.prepare(f"gone-{uuid.uuid4().hex[:8]}", MiB)
    assert slot.path is not None
    os.rmdir(slot.path)
    with pytest.raises(cgroups.CgroupError, match="could not read the OOM counter of .*gone-"):
        slot.oom_kills()
    slot.remove()  # already gone: logs the lost snapshot, removes nothing


# -- cleanup ----------------------------------------------------------------------------------


def test_remove_kills_what_a_task_left_and_close_leaves_no_cgroup(
        caps: cgroups.MemoryCaps, children: list[int]) -> None:
    slot = caps.prepare(f"leaver-{uuid.uuid4().hex[:8]}", 64 * MiB)
    forgotten = caps.prepare(f"forgotten-{uuid.uuid4().hex[:8]}", 64 * MiB)
    group: Path = caps.group  # type: ignore[attr-defined]
    assert slot.path is not None and slot.path.is_dir() and forgotten.path is not None
    ready_r, ready_w = os.pipe()

    def task_with_a_child() -> int:
        slot.enter()
        if os.fork() == 0:  # a grandchild the task never waits for
            time.sleep(120)
            os._exit(0)
        os.write(ready_w, b"r")
        time.sleep(120)
        return 0

    pid = _fork(task_with_a_child, children)
    assert _await_byte(ready_r) == b"r"
    os.close(ready_r)
    os.close(ready_w)
    assert len(cgroups._pids(slot.path)) == 2  # the task and its child, both capped
    assert slot.kill_all() >= 2
    assert _wait(pid) == -signal.SIGKILL
    assert cgroups._pids(slot.path) == []
    slot.remove()
    assert not slot.path.exists()
    assert slot.outcome().oom_killed is False  # answered from the snapshot taken by remove()
    assert slot.oom_kills() in (0, None)  # so is the counter: the cgroup is gone

    # a forked child calling close() must not tear down its parent's cgroups
    def close_in_child() -> int:
        caps.close()
        return 0

    assert _wait(_fork(close_in_child, children)) == 0
    assert forgotten.path.is_dir()
    caps.close()
    assert not forgotten.path.exists() and not group.exists()


def test_remove_sends_an_admitted_runner_home_alive(
        caps: cgroups.MemoryCaps, children: list[int]) -> None:
    """A runner forked ahead of need is admitted per task and outlives the task's cgroup."""
    def idle_runner() -> int:
        time.sleep(120)
        return 0

    runner = _fork(idle_runner, children)
    home = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    slot = caps.prepare(f"admitted-{uuid.uuid4().hex[:8]}", 64 * MiB)
    slot.admit(runner)
    assert slot.path is not None and runner in cgroups._pids(slot.path)
    slot.remove()
    assert not slot.path.exists()
    assert Path(f"/proc/{runner}/cgroup").read_text() == home
    os.kill(runner, signal.SIGKILL)
    assert _wait(runner) == -signal.SIGKILL


# -- non-dumpable runners -----------------------------------------------------------------------

# A miniature worker: started with a broker URL in its environment, as a real one is; it forks
# a runner that drops to `nobody`. The uid drop already resets dumpability to fs.suid_dumpable
# (0 on most hosts, 1 on some), so the runner first makes itself dumpable again: only
# make_non_dumpable() stands between the attacker and the secret. The control stops there.
# The runner prints where the secret sits in its memory and waits until its stdin closes.
_WORKER = r"""
import ctypes, os, sys
from conveyor.worker import isolation
secret = os.environ["CONVEYOR_BROKER_URL"].encode()
pid = os.fork()
if pid == 0:
    isolation.drop_privileges(65534, 65534)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE 1, as with fs.suid_dumpable=1
    if sys.argv[1] == "non-dumpable":
        isolation.make_non_dumpable()
    held = ctypes.create_string_buffer(secret)
    print(os.getpid(), ctypes.addressof(held), len(secret), isolation.is_dumpable(), flush=True)
    sys.stdin.read()
    os._exit(0)
os.waitpid(pid, 0)
"""


def _read_as_nobody(pid: int, address: int, length: int, children: list[int]) -> dict[str, str]:
    """What a sibling task running as `nobody` gets from another runner's /proc files."""
    out_r, out_w = os.pipe()

    def attacker() -> int:
        os.close(out_r)
        isolation.drop_privileges(NOBODY, NOBODY)
        os.write(out_w, json.dumps({"environ": _try_read(f"/proc/{pid}/environ", 0, 1 << 16),
                                    "mem": _try_read(f"/proc/{pid}/mem", address, length)}
                                   ).encode())
        return 0

    child = _fork(attacker, children)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as out:
        data = out.read()
    assert _wait(child) == 0
    seen: dict[str, str] = json.loads(data)
    return seen


def _try_read(path: str, offset: int, length: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length).decode("latin-1")
    except OSError as exc:
        return f"error:{errno.errorcode.get(exc.errno or 0, exc.errno)}"


@pytest.mark.parametrize("mode", ["non-dumpable", "dumpable"])
def test_sibling_of_the_same_uid_cannot_read_a_non_dumpable_runner(
        mode: str, children: list[int]) -> None:
    """Scenario 8, both ways: the same attack succeeds on a dumpable control, so it is real."""
    _require_root("it drops runners and the attacker to uid 65534")
    secret = f"amqp://conveyor:s3cret-{uuid.uuid4().hex}@broker:5672/%2F"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CONVEYOR_BROKER_URL": secret}
    with subprocess.Popen([sys.executable, "-c", _WORKER, mode], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as worker:
        assert worker.stdin is not None and worker.stdout is not None
        line = worker.stdout.readline().split()
        assert len(line) == 4, f"the runner did not start: {line}"
        runner, address, length = int(line[0]), int(line[1]), int(line[2])
        try:
            assert line[3] == str(mode == "dumpable")
            seen = _read_as_nobody(runner, address, length, children)
        finally:
            worker.stdin.close()
            worker.wait(timeout=10)

    if mode == "dumpable":
        assert secret in seen["environ"], seen
        assert seen["mem"] == secret, seen
    else:
        assert seen == {"environ": "error:EACCES", "mem": "error:EACCES"}


def test_privileges_drop_for_good_and_keep_death_signal_and_non_dumpable() -> None:
    """The kernel clears PDEATHSIG on a uid change; a runner must still die with its worker."""
    _require_root("it changes uid")
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            libc = ctypes.CDLL(None)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG, as a runner sets it
            libc.prctl(4, 1, 0, 0, 0)  # dumpable, so only drop_privileges can change it ...
            isolation.make_non_dumpable()  # ... and the runner made itself non-dumpable
            isolation.drop_privileges(NOBODY, NOBODY)
            isolation.drop_privileges(NOBODY, NOBODY)  # again, as a runner does per task
            death_signal = ctypes.c_int(0)
            libc.prctl(2, ctypes.byref(death_signal), 0, 0, 0)  # PR_GET_PDEATHSIG
            regained = True
            try:
                os.setuid(0)
            except PermissionError:
                regained = False
            code = 0 if (os.getresuid() == (NOBODY,) * 3 and os.getgroups() == [] and
                         not regained and death_signal.value == signal.SIGKILL and
                         not isolation.is_dumpable()) else 1
        finally:
            os._exit(code)
    assert _wait(pid) == 0
    with pytest.raises(isolation.IsolationError, match="keeping gid 0"):
        isolation.drop_privileges(NOBODY, None)


# -- environment and descriptors ------------------------------------------------------------------


def test_scrub_environment_removes_the_workers_secrets_and_keeps_the_rest() -> None:
    env = {
        "PATH": "/usr/local/bin:/usr/bin", "HOME": "/home/app", "LANG": "C.UTF-8", "TZ": "UTC",
        "PYTHONPATH": "/app", "SSL_CERT_FILE": "/etc/ssl/certs/ca.pem",
        "CONVEYOR_BROKER_URL": "amqp://conveyor:pw@rabbit/", "CONVEYOR_SIGNING_KEY": "k",
        "DATABASE_URL": "postgresql://app:pw@db/app", "FOO_PASSWORD": "hunter2",
        "REDIS_URL": "redis://cache:6379/0", "SENTRY_DSN": "https://k@sentry/1",
        "GITHUB_TOKEN": "ghp_x", "AWS_SECRET_ACCESS_KEY": "x", "PARTNER_API_KEY": "x",
        "UPSTREAM": "https://user:pw@api.example.com/",
        "OAUTH_CLIENT_SECRET": "x",
    }
    scrubbed = isolation.scrub_environment(env, allow=["PARTNER_API_KEY"])
    assert set(scrubbed) == {"PATH", "HOME", "LANG", "TZ", "PYTHONPATH", "SSL_CERT_FILE",
                             "PARTNER_API_KEY"}
    assert scrubbed["PATH"] == env["PATH"]
    assert "PATH" not in isolation.scrub_environment(env, deny=["PATH"])
    assert env["DATABASE_URL"]  # the input is not modified


def test_close_inherited_fds_closes_an_inherited_pipe(children: list[int]) -> None:
    inherited_r, inherited_w = os.pipe()
    report_r, report_w = os.pipe()
    hold_r, hold_w = os.pipe()

    def runner() -> int:
        isolation.close_inherited_fds(keep=[report_w, hold_r])
        still_open = []
        for fd in (inherited_r, inherited_w, hold_w):
            try:
                os.fstat(fd)
                still_open.append(fd)
            except OSError:
                continue
        os.write(report_w, json.dumps(still_open).encode())
        os.read(hold_r, 1)  # stay alive until the parent has checked the pipe
        return 0

    pid = _fork(runner, children)
    for fd in (report_w, hold_r):
        os.close(fd)
    try:
        assert json.loads(os.read(report_r, 1024)) == []
        # Only the child could still hold the write end now: EOF proves its copy is closed.
        os.close(inherited_w)
        ready, _, _ = select.select([inherited_r], [], [], 5)
        assert ready and os.read(inherited_r, 1) == b""
    finally:
        os.close(hold_w)
        for fd in (inherited_r, report_r):
            os.close(fd)
    assert _wait(pid) == 0
