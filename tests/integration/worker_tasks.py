"""Tasks the worker integration tests run in real runners (imported with -A)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from conveyor.tasks import Retry, Skip, SoftTimeLimitExceeded, task


def write_whole(path: str | Path, text: str) -> None:
    """Write `text` so a test polling for the file never reads it half written: a test that
    waits for the file to exist and then reads a pid read '' under load (Path.write_text
    creates the file before it writes)."""
    partial = Path(f"{path}.partial")
    partial.write_text(text)
    os.replace(partial, path)


@task(name="t.noop")
def noop() -> None:
    return None


@task(name="t.add")
def add(a: int, b: int) -> int:
    return a + b


@task(name="t.tsum", max_retries=0)
def tsum(values: list[int]) -> int:
    """A chord's callback: the sum of its group's results."""
    return sum(values)


@task(name="t.sleep")
def sleep(seconds: float, marker: str = "") -> str:
    if marker:
        write_whole(marker, str(os.getpid()))
    time.sleep(seconds)
    return "slept"


@task(name="t.skip", max_retries=3, retry_backoff=0.1)
def skip(reason: str) -> None:
    raise Skip(reason)


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


@task(name="t.tick")
def tick(path: str, seconds: float) -> str:
    """Append `tick <CLOCK_MONOTONIC>` to `path` every 20 ms for `seconds` (after a line
    `start <pid> <t>`), and `soft <t>` when its soft time limit passes: the test, on the same
    clock, sees when each limit reached the task. It ticks on after the soft limit."""
    deadline = time.monotonic() + seconds
    with open(path, "a", buffering=1) as out:
        out.write(f"start {os.getpid()} {time.monotonic()}\n")
        while True:
            try:   # the whole turn: the limit may land in the check or the write, not the sleep
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
                out.write(f"tick {time.monotonic()}\n")
            except SoftTimeLimitExceeded:
                out.write(f"soft {time.monotonic()}\n")
    return "ticked"


@task(name="t.retry_once")
def retry_once(path: str) -> str:
    marker = Path(path)
    if not marker.exists():
        marker.write_text("1")
        raise Retry("not yet", delay=0.2)
    return "second time"


@task(name="t.retry_slowly")
def retry_slowly(path: str) -> str:
    """Ask for a retry the first time; the second time, say so (`PATH.second`) and wait for
    `PATH.go` before succeeding: a test looks at what the retry held while the second run
    waits, however slow the machine (a 3 s retry delay was once all the time it had)."""
    marker = Path(path)
    if not marker.exists():
        marker.write_text("1")
        raise Retry("not yet", delay=0.5)
    Path(f"{path}.second").touch()
    deadline = time.monotonic() + 120
    while not Path(f"{path}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
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
    """Try to read a sibling runner's environ and a dumpable control process's; then let
    the victim (`t.wait_for_file`) end."""
    deadline = time.time() + 30
    while not Path(victim_pid_file).exists() and time.time() < deadline:
        time.sleep(0.05)
    victim = Path(victim_pid_file).read_text()
    found = {"victim_environ": _try_read(f"/proc/{victim}/environ"),
             "victim_mem": _try_read(f"/proc/{victim}/mem"),
             "control_environ": _try_read(f"/proc/{control_pid}/environ")}
    Path(victim_pid_file + ".read").write_text("done")
    return found


@task(name="t.wait_for_file")
def wait_for_file(marker: str, release: str, cap: float = 60) -> str:
    """Write this runner's pid to `marker`, then wait until `release` exists (at most `cap`
    seconds): a victim that is alive whenever its spy looks, however late the spy starts."""
    write_whole(marker, str(os.getpid()))
    deadline = time.time() + cap
    while not Path(release).exists() and time.time() < deadline:
        time.sleep(0.05)
    return "released"


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
    write_whole(pid_file, str(child.pid))
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


@task(name="t.follow_up")
def follow_up(a: int, b: int, reply_to: str) -> dict[str, object]:
    """Enqueues `t.add(a, b)` on its own queue, as a task that fans out work does; returns
    the follow-up's id and what of the worker's configuration its environment holds."""
    from conveyor import context
    handle = add.enqueue_with((a, b), queue=context.queue, reply_to=reply_to)
    leaked = sorted(k for k, v in os.environ.items()
                    if k.startswith("CONVEYOR_") or "://" in v)
    return {"id": handle.id, "leaked": leaked}


@task(name="t.follow_ups_every_way")
def follow_ups_every_way(reply_to: str, other_url: str) -> dict[str, str]:
    """Enqueues through each producer API a task can reach; returns each message's id (and
    what asking for a result inside a task says)."""
    from conveyor import Message, context
    from conveyor.client import Client, default_client
    from conveyor.config import Settings
    q = context.queue
    ids = {"task.enqueue": add.enqueue(41, 1).id,   # its own queue, "default"
           "default_client": default_client().enqueue(
               Message(queue=q, task="t.add", args=(1, 2), reply_to=reply_to)).id,
           "from_settings": Client.from_settings(Settings.from_env()).enqueue(
               Message(queue=q, task="t.add", args=(2, 3), reply_to=reply_to)).id}
    elsewhere = Client.from_settings(Settings(broker_url=other_url))
    try:
        ids["explicit"] = elsewhere.enqueue(Message(queue=q, task="t.add", args=(3, 4))).id
    finally:
        elsewhere.close()
    try:
        add.enqueue(0, 0).result(timeout=1)
    except Exception as exc:  # noqa: BLE001 - what it says is the point
        ids["result"] = f"{type(exc).__name__}: {exc}"
    from conveyor.broker import from_url
    try:
        from_url()   # no URL: the task user's embedded default, never the worker's
    except Exception as exc:  # noqa: BLE001 - what it says is the point
        ids["bare"] = f"{type(exc).__name__}: {exc}"
    ids["pid"] = str(os.getpid())
    return ids


@task(name="t.follow_up_once")
def follow_up_once(key: str, reply_to: str) -> list[object]:
    """Enqueues `t.add` twice with one unique key, on its own queue: [id, duplicate] each."""
    from conveyor import context
    out: list[object] = []
    for a in (1, 2):
        handle = add.enqueue_with((a, 2), queue=context.queue, reply_to=reply_to,
                                  unique_key=key)
        out += [handle.id, handle.duplicate]
    return out


@task(unique_key="invoice:{invoice_id}")
def send_invoice(invoice_id: int) -> int:
    """Once per invoice (its name is its import path: `conveyor enqueue` finds its key)."""
    return invoice_id


@task(name="t.follow_up_refused")
def follow_up_refused(size: int) -> str:
    """Enqueues a follow-up of `size` bytes; returns how the worker's refusal read."""
    try:
        handle = add.enqueue("x" * size, "")
    except Exception as exc:  # noqa: BLE001 - what it says is the point
        return f"{type(exc).__name__}: {exc}"
    return f"published {handle.id}"


@task(name="t.follow_up_when")
def follow_up_when(go: str, out: str) -> None:
    """Enqueues once `go` exists (the test has taken the broker away meanwhile) and writes
    to `out` what happened."""
    deadline = time.time() + 60
    while not Path(go).exists() and time.time() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    try:
        what = f"published {add.enqueue(1, 1).id}"
    except Exception as exc:  # noqa: BLE001 - what it says is the point
        what = f"{type(exc).__name__}: {exc}"
    write_whole(out, f"{time.monotonic() - started:.1f} {what}")


@task(name="t.ledger")
def ledger(path: str, stop: str, seconds: float = 120, child_pid_file: str = "") -> int:
    """Appends `<pid> <CLOCK_MONOTONIC ns>` to `path` every millisecond until `stop` exists:
    tells when each run of a redelivered message was alive, to the millisecond. With
    `child_pid_file`, first starts a child in a session of its own and writes its pid."""
    if child_pid_file:
        import subprocess
        child = subprocess.Popen(["sleep", str(seconds)], start_new_session=True)
        write_whole(child_pid_file, str(child.pid))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    deadline, lines = time.monotonic() + seconds, 0
    while not os.path.exists(stop) and time.monotonic() < deadline:
        os.write(fd, b"%d %d\n" % (os.getpid(), time.monotonic_ns()))
        lines += 1
        time.sleep(0.001)
    os.close(fd)
    return lines


@task(name="t.echo_big", max_retries=0)
def echo_big(size: int) -> str:
    """A result of `size` bytes: more than one default socket buffer carries."""
    return "x" * size


@task(name="t.garble_channel", max_retries=0)
def garble_channel() -> str:
    """Writes what is not a frame to every socket it holds (its channel to the worker)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                os.write(int(fd), b"\xff not a frame")
        except OSError:
            continue
    time.sleep(1)
    return "wrote"


@task(name="t.follow_up_interrupted")
def follow_up_interrupted(go: str, interrupted: str, resume: str, out: str) -> str:
    """Enqueues once `go` exists (the test has paused the broker); a soft time limit comes
    during the wait and is caught; once `resume` exists (the broker is back), enqueues
    again: the second handle must be the second message's, not the late answer to the
    first request."""
    from conveyor.tasks import SoftTimeLimitExceeded as SoftLimit
    _wait_for_file(go)
    try:
        first = add.enqueue(1, 1).id
    except SoftLimit:
        first = "interrupted"
    Path(interrupted).touch()
    _wait_for_file(resume)
    second = add.enqueue(2, 2).id
    write_whole(out, f"{first} {second}")
    return second


def _wait_for_file(path: str, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while not Path(path).exists() and time.time() < deadline:
        time.sleep(0.05)


@task(name="t.cancellable")
def cancellable(path: str, seconds: float, obey: bool = True) -> str:
    """Write `start <pid>` to `path` and sleep `seconds`; when `Cancelled` is raised in it,
    write `cancelled <t>` (CLOCK_MONOTONIC) and return at once (`obey`), or sleep on,
    ignoring it (killed after the worker's --cancel-grace)."""
    from conveyor import Cancelled
    with open(path, "a", buffering=1) as out:
        out.write(f"start {os.getpid()} {time.monotonic()}\n")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                time.sleep(0.02)
            except Cancelled:
                out.write(f"cancelled {time.monotonic()}\n")
                if obey:
                    return "stopped early"
    return "slept"


@task(name="t.mark", store_result=False)
def mark(path: str, token: str) -> str:
    """Append `<token> <CLOCK_MONOTONIC>` to `path` in one write (O_APPEND: whole lines
    from concurrent runners): a run of this task, and when."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{token} {time.monotonic():.4f}\n".encode())
    finally:
        os.close(fd)
    return token


@task(name="t.runlog", max_retries=0)
def runlog(path: str, tag: str, seconds: float) -> int:
    """For the partition tests: append `start TAG PID T`, `tick TAG PID T` every 50 ms and
    `end TAG PID T` to the ledger at `path` (T: CLOCK_MONOTONIC, which every network namespace
    shares), so a run killed midway shows when it last ran (its last tick), and two runs of
    one task that overlapped show it. Returns its pid: which run's result was kept."""
    pid = os.getpid()

    def line(kind: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, f"{kind} {tag} {pid} {time.monotonic():.6f}\n".encode())
        finally:
            os.close(fd)

    line("start")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        line("tick")
    line("end")
    return pid
