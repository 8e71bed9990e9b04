"""Loading a folder of DAG files: every error names its file and line, the rest loads."""

from __future__ import annotations

from pathlib import Path

from conveyor.scheduler.folder import load_folder

GOOD = '''
from conveyor.scheduler import DAG

dag = DAG("good", schedule="0 3 * * *")
a = dag.command("a", ["true"])
b = dag.command("b", ["true"])
a >> b
'''

BROKEN = {
    "syntax.py": ("from conveyor.scheduler import DAG\ndag = DAG('s'\n", 2, "SyntaxError"),
    "raises.py": ("from conveyor.scheduler import DAG\n\nx = 1\nraise RuntimeError('no db')\n",
                  4, "RuntimeError: no db"),
    "cycle.py": ("from conveyor.scheduler import DAG\ndag = DAG('c')\na = dag.command('a', "
                 "['true'])\nb = dag.command('b', ['true'])\na >> b\nb >> a\n", 6,
                 "DAG 'c' has a cycle: a -> b -> a"),
    "missing.py": ("from conveyor.scheduler import DAG\ndag = DAG('m')\n\n"
                   "dag.command('b', ['true'], upstream=['a'])\n", 4,
                   "task 'b' of DAG 'm' depends on 'a'"),
    "executor.py": ("from conveyor.scheduler import DAG\ndag = DAG('e')\n"
                    "dag.command('a', ['true'], executor='kubernetes')\n", 3,
                    "uses executor 'kubernetes'"),
    "exits.py": ("import sys\nsys.exit(3)\n", 2, "SystemExit: 3"),
    "nodag.py": ("x = 1\n", 1, "declares no DAG"),
    "dupe.py": ("from conveyor.scheduler import DAG\n\ndag = DAG('good')\n"
                "dag.command('a', ['true'])\n", 3, "DAG id 'good' is also declared at"),
}


def test_each_error_names_file_and_line_and_the_good_dag_loads(tmp_path: Path) -> None:
    (tmp_path / "a_good.py").write_text(GOOD)
    for name, (text, _, _) in BROKEN.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "_helper.py").write_text("raise RuntimeError('never imported')\n")

    loaded = load_folder(tmp_path, executors=["queue", "local"])

    assert list(loaded.dags) == ["good"]
    assert loaded.dags["good"].version and loaded.dags["good"].schedule == "0 3 * * *"
    messages = [str(e) for e in loaded.errors]
    assert len(messages) == len(BROKEN), messages
    for name, (_, line, text) in BROKEN.items():
        hits = [m for m in messages if m.startswith(f"{tmp_path / name}:{line}: ")]
        assert hits and text in hits[0], (name, messages)


def test_version_changes_with_the_source(tmp_path: Path) -> None:
    path = tmp_path / "d.py"
    path.write_text(GOOD)
    first = load_folder(tmp_path).dags["good"].version
    path.write_text(GOOD + "\n# edited\n")
    assert load_folder(tmp_path).dags["good"].version != first


def test_missing_folder_is_one_clear_error(tmp_path: Path) -> None:
    loaded = load_folder(tmp_path / "nope")
    assert not loaded.dags
    assert "does not exist" in str(loaded.errors[0])


def test_dag_files_can_import_modules_beside_them(tmp_path: Path) -> None:
    (tmp_path / "_common.py").write_text("COMMAND = ['true']\n")
    (tmp_path / "d.py").write_text("from _common import COMMAND\nfrom conveyor.scheduler import "
                                   "DAG\ndag = DAG('uses_helper')\ndag.command('a', COMMAND)\n")
    assert list(load_folder(tmp_path).dags) == ["uses_helper"]
