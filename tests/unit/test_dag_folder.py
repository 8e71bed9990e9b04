"""Hot reload of a DAGs folder: only changed files are loaded again, a failing file keeps its
last good DAGs, a removed file takes its DAGs with it, and each change says what it was."""

from __future__ import annotations

import os
from pathlib import Path

from conveyor.scheduler.folder import DagFolder

DAG_FILE = '''
from conveyor.scheduler import DAG

dag = DAG({dag_id!r}, schedule={schedule!r})
{tasks}
'''


def write(path: Path, dag_id: str, *tasks: str, schedule: str | None = None) -> None:
    """A DAG file of command tasks; its mtime moves on by a second each time, so a rewrite
    within the file system's timestamp granularity still counts as a change."""
    before = path.stat().st_mtime if path.exists() else 1_700_000_000.0
    lines = "\n".join(f"dag.command({t!r}, ['true'])" for t in tasks)
    path.write_text(DAG_FILE.format(dag_id=dag_id, schedule=schedule, tasks=lines))
    os.utime(path, (before + 1, before + 1))


def test_first_look_loads_everything_and_a_quiet_folder_changes_nothing(tmp_path: Path) -> None:
    write(tmp_path / "a.py", "a", "t1")
    write(tmp_path / "b.py", "b", "t1")
    folder = DagFolder(tmp_path)
    changes = folder.refresh()
    assert sorted(str(c) for c in changes) == [
        f"DAG a (a.py): added, version {folder.dags['a'].version}",
        f"DAG b (b.py): added, version {folder.dags['b'].version}"]
    assert folder.refresh() == []


def test_an_edited_file_is_loaded_again_alone(tmp_path: Path) -> None:
    write(tmp_path / "a.py", "a", "t1")
    write(tmp_path / "b.py", "b", "t1")
    folder = DagFolder(tmp_path)
    folder.refresh()
    b_before, old = folder.dags["b"], folder.dags["a"].version
    write(tmp_path / "a.py", "a", "t1", "t2", schedule="*/5 * * * *")
    [change] = folder.refresh()
    new = folder.dags["a"]
    assert str(change) == f"DAG a (a.py): version {old} -> {new.version}"
    assert sorted(new.tasks) == ["t1", "t2"] and new.schedule == "*/5 * * * *"
    assert folder.dags["b"] is b_before            # not imported again


def test_a_file_that_starts_failing_keeps_its_last_good_version(tmp_path: Path) -> None:
    write(tmp_path / "a.py", "a", "t1")
    folder = DagFolder(tmp_path)
    folder.refresh()
    good = folder.dags["a"]
    (tmp_path / "a.py").write_text("from conveyor.scheduler import DAG\nraise ValueError('x')\n")
    os.utime(tmp_path / "a.py", (1_800_000_000, 1_800_000_000))
    [change] = folder.refresh()
    assert folder.dags["a"] is good
    assert change.error and str(change).startswith(
        f"DAG a (a.py:2): the file no longer loads; version {good.version} stays scheduled")
    [error] = folder.errors
    assert error.location is not None and error.location.line == 2
    assert "ValueError: x" in str(error)
    assert folder.refresh() == []                  # reported once, not at every look
    write(tmp_path / "a.py", "a", "t1", "t3")
    [fixed] = folder.refresh()
    assert not fixed.error and fixed.old == good.version and folder.errors == []


def test_a_removed_file_takes_its_dags_and_a_new_one_brings_them(tmp_path: Path) -> None:
    write(tmp_path / "a.py", "a", "t1")
    folder = DagFolder(tmp_path)
    folder.refresh()
    version = folder.dags["a"].version
    (tmp_path / "a.py").unlink()
    write(tmp_path / "c.py", "c", "t1")
    changes = {c.dag_id: str(c) for c in folder.refresh()}
    assert changes == {
        "a": f"DAG a (a.py): removed (was version {version}); its runs in progress finish",
        "c": f"DAG c (c.py): added, version {folder.dags['c'].version}"}
    assert sorted(folder.dags) == ["c"]


def test_a_dag_id_taken_by_another_file_is_an_error_and_a_vanished_folder_keeps_all(
        tmp_path: Path) -> None:
    write(tmp_path / "a.py", "a", "t1")
    folder = DagFolder(tmp_path)
    folder.refresh()
    write(tmp_path / "b.py", "a", "t9")
    assert folder.refresh() == []
    assert folder.dags["a"].file == str(tmp_path / "a.py")
    assert "DAG id 'a' is also declared at" in str(folder.errors[0])
    (tmp_path / "a.py").unlink()                   # the id is free: b.py takes it
    changes = sorted(str(c) for c in folder.refresh())
    assert changes[1].startswith("DAG a (b.py): added") and folder.errors == []
    assert folder.dags["a"].file == str(tmp_path / "b.py")
    moved = tmp_path.with_name(tmp_path.name + "-moved")
    tmp_path.rename(moved)
    try:
        assert folder.refresh() == [] and list(folder.dags) == ["a"]
        assert "does not exist" in str(folder.errors[0])
    finally:
        moved.rename(tmp_path)
    assert folder.refresh() == [] and list(folder.dags) == ["a"] and folder.errors == []
