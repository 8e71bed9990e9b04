"""Targets: what the autoscaler scales. One module each; all keep the same three promises.

* `replicas()` is the count serving now; replicas already told to stop are not counted
  (as Kubernetes does not count terminating pods).
* `scale(replicas, current)` sets the count. On the way down, idle workers go first and
  every stopped worker drains (SIGTERM: finish what it holds, take nothing new).
* A target that cannot be reached raises `TargetError`: the daemon logs it and tries again
  at the next poll; it never guesses a count.
"""

from __future__ import annotations

from typing import Protocol

from conveyor.errors import ConveyorError


class TargetError(ConveyorError):
    """A target could not be read or scaled (API unreachable, forbidden, not found)."""


class Target(Protocol):
    name: str

    def replicas(self) -> int:
        """Replicas serving now, those stopping excluded."""

    def scale(self, replicas: int, current: int) -> None:
        """Go from `current` to `replicas`; on the way down, idle workers first."""

    def close(self) -> None:
        """Release what the target holds (connections; local workers are drained)."""
