"""Tasks with limits for the flow-control tests: each writes a ledger line when it starts and
when it ends (one O_APPEND write each, so lines from many processes never interleave)."""

from __future__ import annotations

import os
import time

from conveyor import Limit, Rate, task


def _note(path: str, what: str, tag: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {time.time():.6f} {tag}\n".encode())
    finally:
        os.close(fd)


@task(name="f.tenant", concurrency=Limit(key="tenant:{tenant}", max=2), max_retries=0)
def tenant_job(tenant: str, ledger: str, seconds: float = 0.0) -> None:
    _note(ledger, "S", tenant)
    time.sleep(seconds)
    _note(ledger, "E", tenant)


@task(name="f.rated", rate=Rate(key="partner-api", per_second=10, burst=1), max_retries=0)
def rated_job(ledger: str) -> None:
    _note(ledger, "S", "rated")
    _note(ledger, "E", "rated")


@task(name="f.hold", concurrency=Limit(key="held", max=1), max_retries=0)
def hold(ledger: str, tag: str, marker: str = "") -> None:
    """Hold the key a minute the first time (`marker` not there yet), briefly after."""
    _note(ledger, "S", tag)
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(60)
    _note(ledger, "E", tag)


@task(name="f.free", max_retries=0)
def free_job(ledger: str) -> None:
    _note(ledger, "S", "free")
    _note(ledger, "E", "free")
