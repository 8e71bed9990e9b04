"""Tasks the canvas integration tests run: arithmetic, a failure, and a step that counts its
runs in a ledger file (a second run of a step would show there)."""

from __future__ import annotations

import time
from pathlib import Path

from conveyor import task


@task(name="canvas.add", max_retries=0)
def add(x: int, y: int) -> int:
    return x + y


@task(name="canvas.tsum", max_retries=0)
def tsum(values: list[int]) -> int:
    return sum(values)


@task(name="canvas.boom", max_retries=0)
def boom(*args: object) -> None:
    raise ValueError(f"boom after {list(args)}")


@task(name="canvas.step", max_retries=0)
def step(x: int, ledger: str, name: str, pause: float = 0.0) -> int:
    """Append `name` to the ledger, wait `pause` seconds, return x + 1."""
    with Path(ledger).open("a") as out:
        out.write(f"{name}\n")
    time.sleep(pause)
    return x + 1


@task(name="canvas.gather", max_retries=0)
def gather(values: list[int], ledger: str, name: str) -> int:
    """A chord's callback that counts its runs in the ledger: the sum of `values`."""
    with Path(ledger).open("a") as out:
        out.write(f"{name}\n")
    return sum(values)
