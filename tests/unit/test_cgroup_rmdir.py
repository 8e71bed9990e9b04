"""Removing a cgroup directory: EBUSY (the kernel still releasing processes that just
exited) is retried by tenacity for a while; anything else is one CgroupError at once."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from conveyor.worker.cgroups.base import CgroupError, _rmdir


def test_an_empty_directory_is_removed_and_a_missing_one_is_no_error(tmp_path: Path) -> None:
    (tmp_path / "lane").mkdir()
    _rmdir(tmp_path / "lane")
    assert not (tmp_path / "lane").exists()
    _rmdir(tmp_path / "lane")


def test_a_directory_that_is_not_empty_is_not_retried(tmp_path: Path) -> None:
    (tmp_path / "lane" / "inside").mkdir(parents=True)
    with pytest.raises(CgroupError, match=r"could not remove .*lane: Directory not empty; "
                                          r"still inside: no process"):
        _rmdir(tmp_path / "lane", timeout=60)


def test_a_busy_directory_is_tried_again_until_it_goes_or_the_time_is_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EBUSY simulated (a plain directory never is): twice, then the real rmdir."""
    real, tries = os.rmdir, []

    def busy_twice(path: str | os.PathLike[str]) -> None:
        tries.append(path)
        if len(tries) <= 2:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        real(path)
    monkeypatch.setattr(os, "rmdir", busy_twice)
    (tmp_path / "lane").mkdir()
    _rmdir(tmp_path / "lane")
    assert len(tries) == 3 and not (tmp_path / "lane").exists()

    def always_busy(path: str | os.PathLike[str]) -> None:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
    monkeypatch.setattr(os, "rmdir", always_busy)
    with pytest.raises(CgroupError, match="Device or resource busy"):
        _rmdir(tmp_path / "other", timeout=0.05)
