"""Starting the runner zygote (worker/zygote.py) from the worker, and waiting for a fork
server's first frame: the parent's side of the zygote and its lanes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigError
from conveyor.worker import frames


@dataclass(eq=False)
class Zygote:
    """A zygote process started by `spawn_zygote`, not yet known to be ready."""

    proc: subprocess.Popen[bytes]
    control: socket.socket

    def discard(self) -> None:
        """Stop a zygote no pool took (the worker failed to start): it exits when its
        control socket closes."""
        self.control.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def spawn_zygote(apps: list[str] | tuple[str, ...], env: Mapping[str, str], max_tasks: int,
                 uid: int | None = None, gid: int | None = None) -> Zygote:
    """Start the zygote (a fresh interpreter importing `apps`) without waiting for it.

    Its start-up, a few hundred milliseconds of imports and warming, is most of a worker's;
    started before the supervisor imports the apps and connects to the broker, the two
    overlap. `Pool` waits for its ready frame."""
    ours, theirs = frames.pair()
    argv = [sys.executable, "-m", "conveyor.worker.zygote",
            "--control-fd", str(theirs.fileno()), "--max-tasks", str(max_tasks),
            "--parent", str(os.getpid())]
    argv += [f"--app={app}" for app in apps]
    argv += [f"--uid={uid}"] if uid is not None else []
    argv += [f"--gid={gid}"] if gid is not None else []
    try:
        proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=dict(env),
                                stderr=subprocess.PIPE)
    except OSError as exc:
        ours.close()
        raise ConfigError(f"cannot start the runner zygote with {sys.executable}: "
                          f"{exc.strerror} (uid {os.getuid()}); the worker's Python must "
                          f"be executable by the user the worker runs as") from None
    finally:
        theirs.close()
    return Zygote(proc, ours)



def expect_ready(control: socket.socket) -> dict[str, Any] | None:
    """The first frame of a fork server: {"op": "ready", "pid": P}, or None if it died."""
    control.settimeout(60)
    try:
        frame = frames.recv(control)
    except TimeoutError:
        frame = None
    control.settimeout(None)
    return frame if frame is not None and frame.get("op") == "ready" else None
