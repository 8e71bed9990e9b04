"""Loading one DAG file, on its own, so one bad file stops only its own DAGs (`folder.py`
loads a folder's files, and reloads those that change).

A file is imported as a fresh module and every `DAG` among its globals is collected. An
import that raises, a cycle, a dependency on a missing task, or an executor this scheduler
does not have becomes a `DagError` whose message starts with the file and line to fix. A
DAG's version is a hash of its file's source, recorded on each run.

Paths in errors, `dags list` and the store are absolute: one convention, whatever the
current directory of the process that reads them.

An import is bounded in time (`import_timeout`, 30 s by default): a file that blocks (a
`time.sleep`, a network call, an endless loop at module level) is interrupted by SIGALRM,
becomes one error naming the file and the line it was stuck on, and the next file loads.
An alarm, not a child process: nothing is imported twice, no process is added to the idle
scheduler, and signals interrupt sleeps, socket waits and Python loops alike (PEP 475). Off
the main thread (where signals cannot be delivered) imports are not bounded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import DagError, Location

#: Seconds one DAG file may take to import (Airflow's dagbag_import_timeout is also 30).
IMPORT_TIMEOUT = 30.0


class ImportTimeout(BaseException):
    """Raised inside a DAG file's import when its time is up (a BaseException, so the
    file's own `except Exception` does not swallow it)."""


def load_file(path: Path, executors: Sequence[str] = (), *,
              import_timeout: float = IMPORT_TIMEOUT) -> list[DAG]:
    """The DAGs declared in one file, validated; DagError (with file and line) if not."""
    path = path.resolve()
    source = path.read_bytes()
    module = _import(path, import_timeout)
    dags = [value for value in vars(module).values() if isinstance(value, DAG)]
    if not dags:
        raise DagError(Location(str(path), 1), "declares no DAG: assign a "
                                               "conveyor.scheduler.DAG to a module-level name")
    version = hashlib.sha256(source).hexdigest()[:12]
    for dag in dags:
        dag.validate(executors)
        dag.version = version
        dag.source = source.decode("utf-8", "replace")
        dag.file = str(path)
    return dags


def _import(path: Path, timeout: float) -> object:
    """Run the file as a module of its own; turn any failure into a DagError at its line."""
    name = "conveyor_dag_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with _deadline(timeout):
            spec.loader.exec_module(module)
    except DagError:
        raise
    except ImportTimeout as exc:
        raise DagError(_line_in(path, exc), (
            f"importing the DAG file took longer than {timeout:g} s (stuck at this line), so "
            "it was stopped and its DAGs are not loaded; the other files load. Make the "
            "module level quick (no sleeps or network calls at import), or raise "
            "CONVEYOR_DAG_IMPORT_TIMEOUT")) from None
    except SyntaxError as exc:
        raise DagError(Location(str(path), exc.lineno or 1),
                       f"SyntaxError: {exc.msg}") from None
    except (Exception, SystemExit) as exc:  # a DAG file may raise anything, even exit
        raise DagError(_line_in(path, exc), (
            f"{type(exc).__name__}: {exc} (while importing the DAG file; "
            "fix it: a running scheduler loads the file again when it changes)")) from None
    finally:
        sys.modules.pop(name, None)
    return module


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise ImportTimeout in the main thread after `seconds` (0 or off the main thread:
    no limit); the previous SIGALRM handler and timer are put back."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise ImportTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _line_in(path: Path, exc: BaseException) -> Location:
    """The deepest traceback line that is in the DAG file itself."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == path]
    return Location(str(path), (frames[-1].lineno or 1) if frames else 1)
