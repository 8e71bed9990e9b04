"""A worker's code version, derived without running anything: the git revision of the
app's checkout (loose, packed, detached, a worktree's), else a hash of its source files."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.kinds import code_version, pinned_queue
from conveyor.worker.code_version import OFF, announced, derive, git_revision, source_hash

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def checkout(root: Path, head: str = "ref: refs/heads/main\n") -> Path:
    """A repository's `.git` as git leaves it: HEAD naming a branch."""
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head)
    return git


def app_file(folder: Path, name: str = "tasks.py", text: str = "X = 1\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_a_loose_branch_ref_gives_its_commit(tmp_path: Path) -> None:
    git = checkout(tmp_path)
    (git / "refs" / "heads" / "main").write_text(SHA + "\n")
    assert derive([str(app_file(tmp_path / "app" / "deep"))]) == SHA[:12]


def test_a_packed_ref_gives_its_commit(tmp_path: Path) -> None:
    git = checkout(tmp_path)
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{OTHER} refs/heads/dev\n"
                                     f"{SHA} refs/heads/main\n^{OTHER}\n")
    assert git_revision(tmp_path / "app") == SHA[:12]


def test_a_detached_head_is_the_commit(tmp_path: Path) -> None:
    checkout(tmp_path, head=SHA + "\n")
    assert git_revision(tmp_path) == SHA[:12]


def test_a_worktree_reads_its_head_and_the_main_repository_refs(tmp_path: Path) -> None:
    main = checkout(tmp_path / "main")
    (main / "refs" / "heads" / "feature").write_text(OTHER + "\n")
    linked = main / "worktrees" / "wt"
    linked.mkdir(parents=True)
    (linked / "HEAD").write_text("ref: refs/heads/feature\n")
    (linked / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {linked}\n")
    assert derive([str(app_file(tmp_path / "wt"))]) == OTHER[:12]


def test_an_unreadable_head_gives_no_revision(tmp_path: Path) -> None:
    checkout(tmp_path, head="ref: refs/heads/gone\n")
    assert git_revision(tmp_path) == ""


def test_outside_a_checkout_the_source_is_hashed(tmp_path: Path) -> None:
    one = app_file(tmp_path / "a")
    same = app_file(tmp_path / "b")
    changed = app_file(tmp_path / "c", text="X = 2\n")
    assert derive([str(one)]) == derive([str(same)]) == source_hash([one])
    assert derive([str(one)]).startswith("src-")
    assert derive([str(changed)]) != derive([str(one)])


def test_a_package_is_hashed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pinned_app_pkg"
    app_file(package, "__init__.py", "")
    inner = app_file(package / "sub", "tasks.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = derive(["pinned_app_pkg"])
    inner.write_text("X = 2\n")
    assert derive(["pinned_app_pkg"]) != before


def test_a_worker_without_an_app_is_unversioned() -> None:
    assert derive([]) == ""
    assert derive(["no_such_module_for_conveyor_tests"]) == ""


def test_a_version_given_by_hand_must_fit_a_queue_name() -> None:
    assert code_version("v2.1+build-7") == "v2.1+build-7"
    assert code_version("") == ""
    for bad in ("two words", "-leading", "a/b", "x" * 65):
        with pytest.raises(ValueError, match="is not a code version"):
            code_version(bad)
    assert pinned_queue("default", "v2") == "default@v2"


def test_a_worker_announces_the_version_given_else_the_derived_one_unless_none(
        caplog: pytest.LogCaptureFixture) -> None:
    """Without --code-version a worker announces (and serves `<queue>@<version>` for) the
    version derived from its app; `--code-version none` announces none."""
    import argparse
    import logging

    from conveyor.worker.cli import _announce_code_version

    here = str(Path(__file__))
    derived = derive([here])
    assert derived and announced("", [here]) == derived
    assert announced("v7", [here]) == "v7" and announced(OFF, [here]) == ""
    with caplog.at_level(logging.INFO, logger="conveyor.worker"):
        assert _announce_code_version(argparse.Namespace(code_version="v7", app=[])) == "v7"
        assert _announce_code_version(argparse.Namespace(code_version="", app=[here])) == \
            derived
        assert _announce_code_version(argparse.Namespace(code_version=OFF, app=[here])) == ""
    assert f"code version {derived} (derived from the app" in caplog.text
    assert "no code version announced (--code-version none)" in caplog.text
