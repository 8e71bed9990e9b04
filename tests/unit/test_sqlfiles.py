"""Named queries read from a package's `.sql` file (conveyor/sqlfiles.py), installed as a
directory or inside a zip, and the errors when a file holds none or cannot be read."""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import sqlfiles

QUERIES = "-- name: one\nSELECT 1;\n\n-- name: two\nSELECT 2;\n"


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("sqlfiles_probe")]:
        del sys.modules[name]


def test_a_package_directory_gives_its_queries_by_name(on_path: Path) -> None:
    (on_path / "sqlfiles_probe_dir").mkdir()
    (on_path / "sqlfiles_probe_dir" / "__init__.py").write_text("")
    (on_path / "sqlfiles_probe_dir" / "q.sql").write_text(QUERIES)
    assert sqlfiles.load("sqlfiles_probe_dir", "q.sql") == {"one": "SELECT 1;",
                                                             "two": "SELECT 2;"}


def test_a_zipped_package_is_read_through_its_loader(tmp_path: Path) -> None:
    archive = tmp_path / "probe.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("sqlfiles_probe_zip/__init__.py", "")
        z.writestr("sqlfiles_probe_zip/q.sql", QUERIES)
    sys.path.insert(0, str(archive))
    try:
        assert sqlfiles.load("sqlfiles_probe_zip", "q.sql")["two"] == "SELECT 2;"
    finally:
        sys.path.remove(str(archive))
        sys.modules.pop("sqlfiles_probe_zip", None)


def test_a_file_without_named_queries_is_refused(on_path: Path) -> None:
    (on_path / "sqlfiles_probe_none").mkdir()
    (on_path / "sqlfiles_probe_none" / "__init__.py").write_text("")
    (on_path / "sqlfiles_probe_none" / "q.sql").write_text("SELECT 1;\n")
    with pytest.raises(ValueError, match="holds no '-- name:' queries"):
        sqlfiles.load("sqlfiles_probe_none", "q.sql")


def test_a_namespace_package_cannot_hold_query_files(on_path: Path) -> None:
    (on_path / "sqlfiles_probe_ns").mkdir()
    (on_path / "sqlfiles_probe_ns" / "q.sql").write_text(QUERIES)
    with pytest.raises(ValueError, match="its package's loader cannot read files"):
        sqlfiles.load("sqlfiles_probe_ns", "q.sql")
