"""The supervisor's one malloc arena (worker/arenas.py): set where glibc has mallopt,
a no-op elsewhere."""

from __future__ import annotations

import subprocess
import sys

from conveyor.worker.arenas import use_one_arena


def test_glibc_takes_the_limit() -> None:
    # in a child: the limit is for the process's life, and pytest's own threads exist
    probe = "from conveyor.worker.arenas import use_one_arena; print(use_one_arena())"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == "True"


def test_a_c_library_without_mallopt_changes_nothing() -> None:
    class Musl:
        pass

    assert use_one_arena(Musl()) is False


def test_a_refused_limit_says_so() -> None:
    class Refusing:
        @staticmethod
        def mallopt(param: int, value: int) -> int:
            return 0

    assert use_one_arena(Refusing()) is False
