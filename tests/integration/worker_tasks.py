"""Tasks the worker integration tests run in real runners (imported with -A)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from conveyor.tasks import Retry, SoftTimeLimitExceeded, task


@task(name="t.noop")
def noop() -> None:
    return None


@task(name="t.add")
def add(a: int, b: int) -> int:
    return a + b


@task(name="t.sleep")
def sleep(seconds: float, marker: str = "") -> str:
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "slept"


@task(name="t.fail", max_retries=1, retry_backoff=0.1)
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task(name="t.hog", max_retries=2, retry_backoff=0.1, memory_limit="64MiB")
def hog(mib: int) -> int:
    chunks = []
    for _ in range(mib):
        chunk = bytearray(1024 * 1024)
        chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page
        chunks.append(chunk)
    return len(chunks)


@task(name="t.hold")
def hold(mib: int, seconds: float) -> int:
    """Hold `mib` MiB (every page touched) for `seconds`: memory a heartbeat can see."""
    chunk = bytearray(mib * 1024 * 1024)
    chunk[::4096] = b"x" * len(chunk[::4096])
    time.sleep(seconds)
    return len(chunk)


@task(name="t.soft")
def soft(seconds: float) -> str:
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "cleaned up"
    return "finished"


@task(name="t.retry_once")
def retry_once(path: str) -> str:
    marker = Path(path)
    if not marker.exists():
        marker.write_text("1")
        raise Retry("not yet", delay=0.2)
    return "second time"


@task(name="t.env")
def env() -> dict[str, object]:
    raw = Path("/proc/self/environ").read_bytes()
    return {"environ": dict(os.environ), "proc_environ": raw.decode(errors="replace"),
            "uid": os.getuid()}


@task(name="t.record")
def record(path: str, token: str, seconds: float = 0.0) -> str:
    with open(path, "a") as f:
        f.write(f"start {token} {os.getpid()}\n")
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"done {token}\n")
    return token


@task(name="t.spy")
def spy(victim_pid_file: str, control_pid: int) -> dict[str, str]:
    """Try to read a sibling runner's environ and a dumpable control process's."""
    deadline = time.time() + 10
    while not Path(victim_pid_file).exists() and time.time() < deadline:
        time.sleep(0.05)
    victim = Path(victim_pid_file).read_text()
    return {"victim_environ": _try_read(f"/proc/{victim}/environ"),
            "victim_mem": _try_read(f"/proc/{victim}/mem"),
            "control_environ": _try_read(f"/proc/{control_pid}/environ")}


def _try_read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.read(16)
        return "readable"
    except OSError as exc:
        return type(exc).__name__


@task(name="t.hang_once")
def hang_once(path: str, token: str) -> str:
    """Hangs on its first run (to be killed mid-task); completes when run again."""
    log = Path(path)
    first = not log.exists() or f"start {token}" not in log.read_text()
    with open(path, "a") as f:
        f.write(f"start {token} {os.getpid()}\n")
    if first:
        time.sleep(120)
    with open(path, "a") as f:
        f.write(f"done {token}\n")
    return token


@task(name="t.orphan")
def orphan(pid_file: str) -> int:
    """Leaves a child behind in its own session: the worker must not let it linger."""
    import subprocess
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    Path(pid_file).write_text(str(child.pid))
    return child.pid


@task(name="t.which_run")
def which_run(path: str) -> int:
    """Logs and returns its runner's pid: tells apart the runs of a redelivered message."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return os.getpid()


@task(name="t.quiet", store_result=False)
def quiet(a: int, b: int) -> int:
    return a + b


@task(name="t.key_error", max_retries=0)
def key_error() -> None:
    """Fails as its twin in `celery_worker_app` does, to compare the stored results."""
    raise KeyError("k9")


@task(name="t.os_error", max_retries=0)
def os_error() -> None:
    raise OSError(errno.ENOENT, "No such file or directory", "/nonexistent/k9")


@task(name="t.otel_loaded")
def otel_loaded() -> bool:
    """Whether this runner has imported any of OpenTelemetry (the tracing-off test)."""
    import sys
    return any(name.startswith("opentelemetry") for name in sys.modules)
