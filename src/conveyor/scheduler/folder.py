"""The DAGs of a folder: loaded once (`load_folder`), or kept current (`DagFolder`).

Every `*.py` in the folder is loaded on its own (`loader.load_file`, bounded in time), so one
bad file stops only its own DAGs; a DAG id two files both claim stays with the first file.

Hot reload: `DagFolder.refresh()` lists the folder and stats each file (modification time,
size, inode). A file that is new or whose stamp changed goes through the bounded loader
again, a file gone takes its DAGs with it. When nothing changed nothing is read or imported,
so a scheduler that looks every few seconds stays idle.

A file that now fails keeps its last good DAGs scheduled, and its error is reported until it
is fixed: a typo saved by an editor must not stop a production DAG. A run never notices any
of this: it is a snapshot of the version it started with (`runs.py`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.scheduler.dag import DAG
from conveyor.scheduler.errors import DagError, Location
from conveyor.scheduler.loader import IMPORT_TIMEOUT, load_file

log = logging.getLogger("conveyor.scheduler")

#: What identifies a version of a file without reading it: (mtime in ns, size, inode).
Stamp = tuple[int, int, int]


@dataclass(frozen=True)
class Change:
    """What one look changed for one DAG: added (`old` empty), removed (`new` empty), a new
    version, or (with `error`) a file that failed to load while `old` stays scheduled."""

    dag_id: str
    file: str             # relative to the DAGs folder (and the line of an error)
    old: str = ""
    new: str = ""
    error: str = ""

    def __str__(self) -> str:
        where = f"DAG {self.dag_id} ({self.file})" if self.dag_id else f"DAG file {self.file}"
        if self.error and self.old:
            return f"{where}: the file no longer loads; version {self.old} stays scheduled " \
                   f"until it does: {self.error}"
        if self.error:
            return f"{where}: does not load: {self.error}"
        if not self.old:
            return f"{where}: added, version {self.new}"
        if not self.new:
            return f"{where}: removed (was version {self.old}); its runs in progress finish"
        return f"{where}: version {self.old} -> {self.new}"


@dataclass
class _File:
    stamp: Stamp
    dag_ids: list[str] = field(default_factory=list)
    errors: list[DagError] = field(default_factory=list)
    #: DAG ids this file declares that another file held: it loads again once they are free
    blocked: set[str] = field(default_factory=set)


@dataclass
class Loaded:
    """What a folder yielded: the DAGs that can run, and an error per thing that cannot."""

    dags: dict[str, DAG] = field(default_factory=dict)
    errors: list[DagError] = field(default_factory=list)


def load_folder(folder: str | Path, executors: Sequence[str] = (), *,
                import_timeout: float = IMPORT_TIMEOUT) -> Loaded:
    """Load every DAG file in `folder` (not recursive; files starting with '_' skipped).

    The folder joins `sys.path`, as in Airflow, so DAG files can import modules beside them,
    and so does the current directory, from which `conveyor worker --app` imports the task
    modules: a DAG file imports them the same way (`from billing.tasks import ...`).
    """
    folder_ = DagFolder(folder, executors, import_timeout=import_timeout)
    folder_.refresh()
    return folder_.loaded()


def add_importable(root: Path) -> None:
    """Let DAG files import modules beside them and from the current directory."""
    for importable in (root, Path.cwd()):
        if str(importable) not in sys.path:
            sys.path.append(str(importable))


def duplicate_error(dag: DAG, other: DAG) -> DagError:
    return DagError(dag.location, (
        f"DAG id {dag.dag_id!r} is also declared at {other.location}: DAG ids must be "
        "unique across the folder; this one is not loaded"))


class DagFolder:
    """The DAGs a folder declares, as of the last `refresh()` (the first one loads all)."""

    def __init__(self, folder: str | Path, executors: Sequence[str] = (), *,
                 import_timeout: float = IMPORT_TIMEOUT) -> None:
        self.root = Path(folder).resolve()
        self.executors = tuple(executors)
        self.import_timeout = import_timeout
        self.dags: dict[str, DAG] = {}
        self._files: dict[Path, _File] = {}
        self._missing: DagError | None = None

    @property
    def errors(self) -> list[DagError]:
        """Why some DAGs do not load (or are stuck at their last good version)."""
        found = [self._missing] if self._missing else []
        return found + [e for path in sorted(self._files) for e in self._files[path].errors]

    def loaded(self) -> Loaded:
        return Loaded(dags=dict(self.dags), errors=self.errors)

    def refresh(self) -> list[Change]:
        """Reload what changed since the last look; one `Change` per DAG affected."""
        stamps = self._stamps()
        if stamps is None:       # a folder briefly gone (a deploy swapping it) unschedules nothing
            return []
        changes: list[Change] = []
        for path in sorted(set(self._files) - set(stamps)):
            changes += self._forget(path)
        for path in sorted(stamps):
            known = self._files.get(path)
            if known is None or known.stamp != stamps[path] or any(
                    dag_id not in self.dags for dag_id in known.blocked):
                changes += self._reload(path, stamps[path])
        return changes

    def _stamps(self) -> dict[Path, Stamp] | None:
        """The folder's DAG files and their stamps; None (and an error) if it is missing."""
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            self._missing = DagError(None, f"DAGs folder {str(self.root)!r} does not exist: "
                                           "pass --dags-folder or set CONVEYOR_DAGS_FOLDER")
            return None
        self._missing = None
        add_importable(self.root)
        stamps: dict[Path, Stamp] = {}
        for entry in entries:
            if entry.name.endswith(".py") and not entry.name.startswith("_") \
                    and entry.is_file():
                try:
                    st = entry.stat()
                except OSError:          # removed between the listing and the stat
                    continue
                stamps[Path(entry.path)] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return stamps

    def _name(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _forget(self, path: Path) -> list[Change]:
        gone = self._files.pop(path)
        return [Change(dag_id, self._name(path), old=self.dags.pop(dag_id).version)
                for dag_id in gone.dag_ids]

    def _reload(self, path: Path, stamp: Stamp) -> list[Change]:
        before = self._files.get(path) or _File(stamp)
        try:
            dags = load_file(path, self.executors, import_timeout=self.import_timeout)
        except (DagError, OSError) as exc:
            error = exc if isinstance(exc, DagError) else DagError(
                Location(str(path), 1), f"cannot read the DAG file: {exc}")
            self._files[path] = _File(stamp, before.dag_ids, [error])
            where = self._name(path) + (f":{error.location.line}" if error.location else "")
            kept = [Change(d, where, old=self.dags[d].version, error=error.reason)
                    for d in before.dag_ids]
            return kept or [Change("", where, error=error.reason)]
        now = _File(stamp)
        changes: list[Change] = []
        for dag in dags:
            owner = self._owner(dag.dag_id)
            if owner is not None and owner != path:
                now.errors.append(duplicate_error(dag, self.dags[dag.dag_id]))
                now.blocked.add(dag.dag_id)
                continue
            old = self.dags.get(dag.dag_id)
            self.dags[dag.dag_id] = dag
            now.dag_ids.append(dag.dag_id)
            if old is None or old.version != dag.version:
                changes.append(Change(dag.dag_id, self._name(path),
                                      old=old.version if old else "", new=dag.version))
        for dag_id in before.dag_ids:
            if dag_id not in now.dag_ids:
                changes.append(Change(dag_id, self._name(path),
                                      old=self.dags.pop(dag_id).version))
        self._files[path] = now
        return changes

    def _owner(self, dag_id: str) -> Path | None:
        for path, known in self._files.items():
            if dag_id in known.dag_ids:
                return path
        return None
