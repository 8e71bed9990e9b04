"""What a worker imports so its tasks are registered: `--app` modules, and DAG files.

A task defined in a DAG file (TaskFlow: `@task` beside the `DAG`) is registered only in
a process that imported that file. The scheduler imports it to read the DAG; a worker
given the DAGs folder (`--dags-folder`, ./dags by default when it exists) imports its
files too, in the supervisor and in the zygote that forks the runners, so the task reaches
a worker without anyone naming the file's module in `--app`.

A DAG file is imported as the scheduler's loader does it (a module of its own, its folder
and the current directory importable), but a file that fails is only logged: the
scheduler reports DAG files that do not load, and a worker must keep serving the others.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import sys
from pathlib import Path

from conveyor.errors import ConfigError
from conveyor.locations import DAGS, dags_folder

log = logging.getLogger("conveyor.worker")


def dag_files(configured: str) -> list[str]:
    """The DAG files of the folder a worker was given (the default, ./dags, may be
    absent: a worker needs no DAGs); one it was given that does not exist is an error."""
    if not configured:
        return []
    folder = Path(dags_folder(configured))
    if not folder.is_dir():
        if configured == DAGS:
            return []
        raise ConfigError(f"--dags-folder {configured!r} is not a folder: give the folder of "
                          "the DAG files whose tasks this worker runs (or '' for none)")
    return [str(p.resolve()) for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]


def import_app(entry: str) -> bool:
    """Import an `--app` module (an error stops the worker), or a DAG file by its path (a
    failure is logged and skipped); whether it imported."""
    if not entry.endswith(".py"):
        try:
            importlib.import_module(entry)
        except Exception as exc:
            raise ConfigError(f"cannot import --app module {entry!r}: "
                              f"{type(exc).__name__}: {exc}") from None
        return True
    try:
        _import_file(Path(entry))
    except Exception as exc:   # a DAG file may raise anything; the scheduler reports it
        log.warning("DAG file %s not imported, its tasks are unknown here: %s: %s", entry,
                    type(exc).__name__, exc)
        return False
    return True


def _import_file(path: Path) -> None:
    name = "conveyor_dag_" + hashlib.sha1(str(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return
    for importable in (str(path.parent), str(Path.cwd())):
        if importable not in sys.path:
            sys.path.append(importable)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
