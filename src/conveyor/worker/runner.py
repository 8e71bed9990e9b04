"""The task runner: the forked child that runs user code, and nothing else.

A runner is forked ahead of need by the zygote, so a task never waits for a fork. Before any
user code runs it is non-dumpable (no /proc/<pid>/mem, environ or ptrace for siblings of
the same uid), dies with its parent, holds only its own channel and output pipe, and lives
in an environment that never held the worker's secrets (the zygote was exec'd with a
scrubbed environment). It is born inside its lane's memory cgroup (one per slot, capped for
each task as it starts: worker/pool.py); the runner drops to the configured uid/gid and runs
the task.

Shell-command workloads are exec'd in place, inside the same cgroup and uid. exec resets
dumpability for a plain binary, so an exec'd command IS readable by other processes of its
uid: the cgroup cap, the uid drop, the scrubbed environment and the closed descriptors
remain. Run command workloads under a uid of their own (`--uid`) if tasks must not read them.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

from conveyor.context import TaskContext, context
from conveyor.errors import Cancelled, UnknownTask
from conveyor.tasks import PROCESS_INIT, Defer, Retry, Skip, SoftTimeLimitExceeded, lookup
from conveyor.tracing import TRACEPARENT
from conveyor.worker import followups, frames, isolation


@dataclass(frozen=True)
class RunnerConfig:
    """What every runner of a worker shares; sent once to the zygote."""

    max_tasks: int = 1
    uid: int | None = None
    gid: int | None = None


def runner_main(channel: socket.socket, output_fd: int, config: RunnerConfig) -> NoReturn:
    """Entry point in the forked child. Never returns."""
    try:
        isolation.die_with_parent()
        if os.getppid() == 1:  # the zygote died before we asked: nobody to run for
            os._exit(0)
        _prepare(channel, output_fd)
        followups.install(channel)  # what a task enqueues, its worker publishes
        init_failure = _process_init(config)
        for _ in range(config.max_tasks):
            frame = frames.recv_task(channel)
            if frame is None:
                break
            _set_oom_score_adj(0)  # the task is now the one the OOM killer should pick
            isolation.drop_privileges(config.uid, config.gid)
            isolation.make_non_dumpable()
            report = init_failure or run_frame(frame, channel)
            sys.stdout.flush()  # its output before its report: the supervisor logs it under
            sys.stderr.flush()  # the task, then hands the run over when the report arrives
            _send_report(channel, report)
    except isolation.IsolationError as exc:
        _refuse(exc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _send_report(channel: socket.socket, report: dict[str, Any]) -> None:
    """The report, or, if the channel cannot carry it (a result of megabytes), a failure
    that says so: never an exit without a word, which reads as a lost runner."""
    try:
        frames.send(channel, report)
    except frames.FrameTooLarge as exc:
        frames.send(channel, {"outcome": "failed", "error": _error(exc),
                              "reason": f"the task's report is too large for its worker: "
                                        f"{exc}; return a reference (a path or URL) to "
                                        f"large data instead"})


EX_OSERR = 71  # sysexits.h: an operating-system error (here: the runner could not isolate)


def _refuse(exc: isolation.IsolationError) -> NoReturn:
    """Exit without running the task, saying why on stderr: the supervisor quotes that line."""
    try:
        os.write(2, f"runner {os.getpid()} cannot isolate itself: {exc}\n".encode())
    finally:
        os._exit(EX_OSERR)


def join_cgroup(cgroup_procs: str) -> None:
    """Move this process into a cgroup (a lane, once); a lane that cannot is useless."""
    if not cgroup_procs:
        return
    try:
        with open(cgroup_procs, "w") as procs:
            procs.write(str(os.getpid()))
    except OSError as exc:
        os.write(2, f"runner lane {os.getpid()} cannot join {cgroup_procs}: {exc}\n".encode())
        os._exit(70)


def protect_from_oom_killer() -> None:
    """Lanes and idle runners (which inherit this) are never the OOM killer's pick."""
    _set_oom_score_adj(-1000)


def _set_oom_score_adj(value: int) -> None:
    """Plain os calls, no file object: a fresh runner pays for every object it builds."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, b"%d" % value)
    except OSError:
        return  # not root: lowering is not allowed, and nothing was lowered to raise
    finally:
        os.close(fd)


#: /dev/null, opened once per lane (prepare_lane); each runner makes it its stdin.
_devnull = -1


def prepare_lane() -> None:
    """What every runner of a lane would set up identically, done once in the lane.

    A runner is a fork of its lane: the objects built here are its own at no cost, while
    each one a runner builds for itself costs it the construction plus a copy-on-write
    fault for every page that touches (measured: the two line-buffered text files and the
    signal set-up were ~0.5 ms of a fresh runner's CPU). The text files wrap descriptors 1
    and 2, which each runner points at its own output pipe before any task runs; the lane
    itself never writes to them. SIGUSR1 (the soft time limit) and SIGUSR2 (a cancel) are
    only ever sent to a runner running a task. The default client a task enqueues through
    is built here too, without its channel (followups.prepare).
    """
    global _devnull
    _devnull = os.open(os.devnull, os.O_RDONLY)
    signal.signal(signal.SIGUSR1, _soft_time_limit)
    signal.signal(signal.SIGUSR2, _cancelled)
    followups.prepare()  # each runner only gives it its channel (followups.install)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - line-buffered log
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _prepare(channel: socket.socket, output_fd: int) -> None:
    """Non-dumpable, stdin /dev/null, stdout and stderr to its output pipe, no other
    descriptor. Signals are as the zygote and the lane left them: SIGINT and SIGTERM
    ignored (Ctrl-C is for the supervisor; drains let running tasks finish), SIGCHLD the
    default, SIGUSR1 the soft time limit and SIGUSR2 a cancel (prepare_lane)."""
    isolation.make_non_dumpable()
    if _devnull < 0:
        prepare_lane()
    os.dup2(_devnull, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    isolation.close_inherited_fds(keep=[channel.fileno()])


def _process_init(config: RunnerConfig) -> dict[str, Any] | None:
    """Run the `worker_process_init` hooks while idle, as the task's uid; a failure becomes
    the report of every task this runner is given (None if all went well)."""
    if not PROCESS_INIT:
        return None
    try:
        isolation.drop_privileges(config.uid, config.gid)
    except isolation.IsolationError:
        return None  # no hook runs privileged; the drop fails again, and says why, at the task
    for hook in PROCESS_INIT:
        try:
            hook()
        except BaseException as exc:  # noqa: BLE001 - reported with the task, not lost
            name = f"{hook.__module__}.{hook.__qualname__}"
            return {"outcome": "failed", "error": _error(exc),
                    "reason": f"worker_process_init hook {name} failed in runner "
                              f"{os.getpid()}: {type(exc).__name__}: {exc}"}
    return None


def _soft_time_limit(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeLimitExceeded("soft time limit passed: finish or clean up now")


def _cancelled(signum: int, frame: FrameType | None) -> None:
    raise Cancelled("this task was cancelled: clean up and return (it is killed after the "
                    "worker's --cancel-grace)")


def run_frame(frame: dict[str, Any], channel: socket.socket) -> dict[str, Any]:
    """Run one task frame and return the report frame; with a trace context in the frame,
    the report says when the task started and ended (the supervisor emits the run span:
    this process loads no tracing library and exits right after its report)."""
    if TRACEPARENT not in frame["message"].get("headers", {}):
        return _run_task(frame["message"], channel)
    started = time.time_ns()
    report = _run_task(frame["message"], channel)
    report["span"] = [started, time.time_ns()]
    return report


def _run_task(message: dict[str, Any], channel: socket.socket) -> dict[str, Any]:
    task_context = TaskContext.from_wire(message)
    if message.get("command"):
        _exec_command(message["command"], channel, task_context.as_environment())
    try:
        context.set(task_context)
        result = lookup(message["task"]).fn(*message.get("args", ()), **message.get("kwargs", {}))
        report = {"outcome": "succeeded", "result": _json_safe(result)}
        if context.asset_extras():   # set for its outlets' asset events (a DAG task)
            report["asset_extra"] = _json_safe(context.asset_extras())
        return report
    except UnknownTask as exc:
        return {"outcome": "unknown_task", "reason": str(exc)}
    except Skip as exc:
        return {"outcome": "skipped", "reason": str(exc)}
    except Defer as exc:
        return _deferral(exc)
    except Retry as exc:
        return {"outcome": "retry_requested", "reason": str(exc), "retry_delay": exc.delay,
                "error": _error(exc)}
    except SoftTimeLimitExceeded as exc:
        return {"outcome": "timed_out", "reason": "soft time limit passed", "error": _error(exc)}
    except Cancelled as exc:  # the supervisor knows: the outcome is its to say
        return {"outcome": "cancelled", "error": _error(exc)}
    except BaseException as exc:  # noqa: BLE001 - any task failure becomes a report
        return {"outcome": "failed", "error": _error(exc)}


def _deferral(defer: Defer) -> dict[str, Any]:
    """The report of a task that deferred: its trigger as the state store keeps it; a
    trigger that cannot be described fails the task, saying why."""
    from conveyor.triggers.base import Trigger, TriggerError
    try:
        if not isinstance(defer.trigger, Trigger):
            raise TriggerError(f"Defer needs a conveyor.triggers.Trigger, not "
                               f"{type(defer.trigger).__name__}")
        classpath, kwargs = defer.trigger.serialize()
    except TriggerError as exc:
        return {"outcome": "failed", "error": _error(exc)}
    return {"outcome": "deferred", "reason": str(defer),
            "deferral": {"classpath": classpath, "kwargs": kwargs, "timeout": defer.timeout}}


def _exec_command(command: list[str], channel: socket.socket,
                  context_env: dict[str, str]) -> NoReturn:
    """Replace the runner with the command; its exit status becomes the outcome. It finds
    its context in CONVEYOR_CTX_* variables."""
    frames.send(channel, {"mode": "exec"})
    try:
        os.execvpe(command[0], command, {**os.environ, **context_env})
    except OSError as exc:
        frames.send(channel, {"outcome": "failed", "error": _error(exc),
                                "reason": f"cannot run {command[0]!r}: {exc.strerror}"})
        os._exit(127)


def _error(exc: BaseException) -> dict[str, Any]:
    """The exception as data; `module` and `args` let a Celery result rebuild it exactly."""
    return {"type": type(exc).__qualname__, "module": type(exc).__module__,
            "args": [_json_or_repr(a) for a in exc.args], "message": str(exc)[:4000],
            "traceback": "".join(traceback.format_exception(exc))[-16000:]}


def _json_or_repr(value: Any) -> Any:
    """`value` if JSON carries it, else its repr (as Celery's JSON backend does)."""
    import json
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _json_safe(result: Any) -> Any:
    """The task's result if JSON can carry it; otherwise a clear error instead of pickling."""
    import json
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"task result of type {type(result).__name__} is not JSON: return "
                        f"plain data (dict, list, str, numbers) ({exc})") from None
    return result
