"""Runners die at real-time priority where the worker may have it, without root too.

The kernel lets a process without CAP_SYS_NICE take SCHED_FIFO up to its RLIMIT_RTPRIO soft
limit; sentinel.realtime asks for priority 1. These start the helper, and a worker, from
root with CAP_SYS_NICE dropped (setpriv) under a given RLIMIT_RTPRIO (prlimit): with 0 the
call must fail silently and the worker's start line say so; with 1 it must succeed.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.worker import sentinel
from tests.integration.workerkit import APP, ROOT, finish, worker_env

DROP = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]
PROBE = ("import os; from conveyor.worker.sentinel import has_sys_nice, realtime; "
         "print(has_sys_nice(), realtime(0), os.sched_getscheduler(0) & 0xff)")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("prlimit") is None,
    reason="drops CAP_SYS_NICE from root through setpriv and sets RLIMIT_RTPRIO with prlimit")


def without_sys_nice(rtprio: int) -> list[str]:
    """The argv prefix: no CAP_SYS_NICE, RLIMIT_RTPRIO `rtprio` (skips if this machine's hard
    limit is lower and raising it is not permitted: CAP_SYS_RESOURCE)."""
    if subprocess.run(["prlimit", f"--rtprio={rtprio}", "true"],
                      capture_output=True).returncode != 0:
        hard = resource.getrlimit(resource.RLIMIT_RTPRIO)[1]
        pytest.skip(f"RLIMIT_RTPRIO {rtprio} cannot be set here (hard limit {hard}, and "
                    f"raising it needs CAP_SYS_RESOURCE)")
    return ["prlimit", f"--rtprio={rtprio}", *DROP]


def probe(prefix: list[str]) -> list[str]:
    out = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": f"{ROOT}/src"})
    assert out.returncode == 0, out.stderr  # a refusal is an answer, never an exception
    return out.stdout.split()


def test_without_sys_nice_or_rtprio_realtime_is_refused_silently() -> None:
    assert probe(without_sys_nice(0)) == ["False", "False", str(os.SCHED_OTHER)]


def test_rtprio_1_gives_realtime_without_sys_nice() -> None:
    assert probe(without_sys_nice(1)) == ["False", "True", str(os.SCHED_FIFO)]


def test_the_start_line_says_which_path(tmp_path: Path, unique: str) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    argv = [sys.executable, "-m", "conveyor.cli", "worker", f"--queues=rt-{unique}",
            f"--app={APP}", "--heartbeat-interval=1", "--burst"]
    slow = finish(subprocess.Popen([*without_sys_nice(0), *argv], cwd=ROOT,
                                   env=worker_env(url), text=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT))
    assert "runner teardown: ordinary priority (no CAP_SYS_NICE and RLIMIT_RTPRIO 0" in slow
    if sentinel.has_sys_nice():  # so has a worker started as this process is
        fast = finish(subprocess.Popen(argv, cwd=ROOT, env=worker_env(url), text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        assert "runner teardown: real-time\n" in fast
