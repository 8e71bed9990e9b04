"""Errors of the scheduler, under the package's one tree (`conveyor.errors.ConveyorError`)."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.errors import ConveyorError


@dataclass(frozen=True)
class Location:
    """Where something was declared: a DAG file and a line in it."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class DagError(ConveyorError):
    """A DAG cannot be loaded: the message starts with the file and line to fix."""

    def __init__(self, location: Location | None, message: str) -> None:
        super().__init__(f"{location}: {message}" if location else message)
        self.location = location
        self.reason = message


class ExecutorError(ConveyorError):
    """An executor refused a workload for good (bad spec, rejected by the API).

    The attempt fails with this message; anything else an executor raises (a broker or API
    that cannot be reached) stops the scheduler so a clean process can retry.
    """


class RunError(ConveyorError):
    """A run cannot be created or found (unknown DAG, duplicate logical date, bad conf)."""
