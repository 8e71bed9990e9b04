"""Loading DAG files: every `*.py` in a folder, each on its own, so one bad file stops only
its own DAGs.

A file is imported as a fresh module and every `DAG` among its globals is collected. An
import that raises, a cycle, a dependency on a missing task, an executor this scheduler does
not have, or a DAG id two files both claim becomes a `DagError` whose message starts with the
file and line to fix. A DAG's version is a hash of its file's source, recorded on each run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import DagError, Location


@dataclass
class Loaded:
    """What a folder yielded: the DAGs that can run, and an error per thing that cannot."""

    dags: dict[str, DAG] = field(default_factory=dict)
    errors: list[DagError] = field(default_factory=list)


def load_folder(folder: str | Path, executors: Sequence[str] = ()) -> Loaded:
    """Load every DAG file in `folder` (not recursive; files starting with '_' skipped).

    The folder joins `sys.path`, as in Airflow, so DAG files can import modules beside them,
    and so does the current directory, from which `conveyor worker --app` imports the task
    modules: a DAG file imports them the same way (`from billing.tasks import ...`).
    """
    loaded = Loaded()
    root = Path(folder)
    if not root.is_dir():
        loaded.errors.append(DagError(None, f"DAGs folder {str(root)!r} does not exist: pass "
                                            "--dags-folder or set CONVEYOR_DAGS_FOLDER"))
        return loaded
    for importable in (root.resolve(), Path.cwd()):
        if str(importable) not in sys.path:
            sys.path.append(str(importable))
    for path in sorted(root.glob("*.py")):
        if not path.name.startswith("_"):
            _add_file(loaded, path, executors)
    return loaded


def _add_file(loaded: Loaded, path: Path, executors: Sequence[str]) -> None:
    try:
        dags = load_file(path, executors)
    except DagError as exc:
        loaded.errors.append(exc)
        return
    for dag in dags:
        other = loaded.dags.get(dag.dag_id)
        if other is not None:
            loaded.errors.append(DagError(dag.location, (
                f"DAG id {dag.dag_id!r} is also declared at {other.location}: DAG ids must be "
                "unique across the folder; this one is not loaded")))
        else:
            loaded.dags[dag.dag_id] = dag


def load_file(path: Path, executors: Sequence[str] = ()) -> list[DAG]:
    """The DAGs declared in one file, validated; DagError (with file and line) if not."""
    source = path.read_bytes()
    module = _import(path)
    dags = [value for value in vars(module).values() if isinstance(value, DAG)]
    if not dags:
        raise DagError(Location(str(path), 1), "declares no DAG: assign a "
                                               "conveyor.scheduler.DAG to a module-level name")
    version = hashlib.sha256(source).hexdigest()[:12]
    for dag in dags:
        dag.validate(executors)
        dag.version = version
        dag.file = str(path)
    return dags


def _import(path: Path) -> object:
    """Run the file as a module of its own; turn any failure into a DagError at its line."""
    name = "conveyor_dag_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except DagError:
        raise
    except SyntaxError as exc:
        raise DagError(Location(str(path), exc.lineno or 1),
                       f"SyntaxError: {exc.msg}") from None
    except (Exception, SystemExit) as exc:  # a DAG file may raise anything, even exit
        raise DagError(_line_in(path, exc), (
            f"{type(exc).__name__}: {exc} (while importing the DAG file; "
            "fix it and the scheduler loads it on its next start)")) from None
    finally:
        sys.modules.pop(name, None)
    return module


def _line_in(path: Path, exc: BaseException) -> Location:
    """The deepest traceback line that is in the DAG file itself."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == path.resolve()]
    return Location(str(path), (frames[-1].lineno or 1) if frames else 1)
