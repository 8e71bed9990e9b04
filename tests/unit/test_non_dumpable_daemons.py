"""The long-running commands make themselves non-dumpable before anything else.

They hold credentials (broker and database URLs, the signing key) and start workers whose
tasks may run as the same uid: a same-uid process must not read their environ or memory.
Checked in a fresh interpreter, after `main()` returned on a bad flag, the earliest exit.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from conveyor.cli import main
try:
    main([sys.argv[1], "--no-such-flag"])
except SystemExit:
    pass
from conveyor.worker.isolation import is_dumpable
print(is_dumpable())
"""


@pytest.mark.parametrize("command, dumpable", [
    ("worker", "False"), ("scheduler", "False"), ("autoscaler", "False"), ("up", "False"),
    ("status", "True"),  # one-shot commands stay debuggable
])
def test_daemons_are_non_dumpable_from_the_start(command: str, dumpable: str) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, command], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == dumpable, done.stderr
