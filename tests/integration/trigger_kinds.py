"""User-written triggers for tests/integration/test_triggerer.py: the triggerer imports
them by module path (tests run from the repository root, which is on its sys.path)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from conveyor.triggers import Trigger


@dataclass
class Countdown(Trigger):
    """Fires after `ticks` short sleeps, with how many it counted."""

    ticks: int

    async def run(self) -> dict[str, int]:
        for _ in range(self.ticks):
            await asyncio.sleep(0.05)
        return {"counted": self.ticks}


@dataclass
class Broken(Trigger):
    """Raises: its task fails with the error."""

    async def run(self) -> None:
        raise RuntimeError("the endpoint is gone")
