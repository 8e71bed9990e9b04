"""The trigger protocol: a JSON-able description of a wait, and the coroutine that waits.

A trigger is a dataclass whose fields are JSON values (they cross from the task's runner to
the state store to a triggerer) with `async def run(self)` returning the payload the
resumed task reads as `context.trigger_event` (a JSON value). It runs in the triggerer's one
event loop beside thousands of others: it must await (`asyncio.sleep`, async I/O,
`asyncio.to_thread` for a blocking call), never block. Its class must be importable in the
triggerer by its module path (`module:QualName`).

    @dataclass
    class QueueEmpty(Trigger):
        url: str

        async def run(self) -> dict[str, int]:
            while (n := await asyncio.to_thread(depth, self.url)) > 0:
                await asyncio.sleep(5)
            return {"depth": n}
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

from conveyor.errors import ConveyorError


class TriggerError(ConveyorError):
    """A trigger that cannot be described, loaded or run: says which and what to do."""


class Trigger:
    """Base class of triggers (see the module docstring)."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """(classpath, kwargs): what the state store keeps and `load` rebuilds it from."""
        cls = type(self)
        if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
            raise TriggerError(f"trigger class {cls.__qualname__} is defined in a function or "
                               f"in __main__: the triggerer imports it by its module path; "
                               f"define it at the top of an importable module")
        kwargs = dataclasses.asdict(self) if dataclasses.is_dataclass(self) else dict(
            vars(self))
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError) as exc:
            raise TriggerError(f"trigger {cls.__qualname__}: its fields must be JSON values "
                               f"({exc})") from None
        return f"{cls.__module__}:{cls.__qualname__}", kwargs

    async def run(self) -> Any:
        """Wait; return the payload when the trigger fires."""
        raise NotImplementedError(f"{type(self).__qualname__}.run")


def load(classpath: str, kwargs: dict[str, Any]) -> Trigger:
    """The trigger `serialize` described; a TriggerError naming what is missing."""
    module, _, name = classpath.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise TriggerError(f"trigger class {classpath} cannot be imported in the triggerer "
                           f"({exc}): install its module where the triggerer runs, or put "
                           f"its folder on PYTHONPATH") from None
    if not (isinstance(found, type) and issubclass(found, Trigger)):
        raise TriggerError(f"{classpath} is not a conveyor.triggers.Trigger subclass")
    try:
        return found(**kwargs)
    except TypeError as exc:
        raise TriggerError(f"trigger {classpath} cannot be built from {kwargs}: {exc}") from None
