"""The zygote's warm-up: what it caches must stay right, and it must never stop a worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _in_fresh_interpreter(code: str) -> str:
    """warm() changes process-wide state (importlib.metadata): run it where that is fine."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_versions_are_memoised_and_still_right() -> None:
    out = _in_fresh_interpreter("""
        import importlib.metadata as md
        expected = md.version("pytest")
        from conveyor.worker import warmup
        warmup.warm()
        assert md.version("pytest") == expected
        assert md.version.cache_info().currsize > 0
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_missing_distribution_still_raises_every_time() -> None:
    out = _in_fresh_interpreter("""
        import importlib.metadata as md
        from conveyor.worker import warmup
        warmup.warm()
        for _ in range(2):
            try:
                md.version("no-such-distribution-here")
            except md.PackageNotFoundError:
                print("raised")
    """)
    assert out.split() == ["raised", "raised"]


def test_warm_loads_the_name_service_and_lazy_modules() -> None:
    out = _in_fresh_interpreter("""
        import sys
        import importlib.metadata   # as a client library of the app would
        from conveyor.worker import warmup
        warmup.warm()
        print(all(name in sys.modules for name in ("encodings.idna", "secrets",
                                                   "email.parser")))
    """)
    assert out.strip() == "True"


def test_an_app_that_never_asks_for_versions_does_not_pay_for_them() -> None:
    out = _in_fresh_interpreter("""
        import sys
        from conveyor.worker import warmup
        warmup.warm()
        print(any(name in sys.modules for name in ("importlib.metadata", "email.parser")))
    """)
    assert out.strip() == "False"


def test_a_failing_step_does_not_stop_the_others() -> None:
    out = _in_fresh_interpreter("""
        import socket, sys
        import importlib.metadata as md
        from conveyor.worker import warmup
        def broken(*args, **kwargs):
            raise RuntimeError("resolver broken")
        warmup._resolve_names = broken
        warmup.warm()
        print(hasattr(md.version, "cache_info"))
    """)
    assert out.strip() == "True"
