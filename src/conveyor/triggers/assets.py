"""AssetTrigger: fires when an event of an asset is recorded after the task deferred (a
task's outlet, `conveyor assets touch`, `Client.touch_asset`, the JSON API). Its payload:
{"event_id", "uri", "extra", "timestamp", "source"}.

This layer does not read the state store: the triggerer serves the asset events
(`ASSET_EVENTS`, set in its loop by conveyor/triggerer/assets.py), one query per poll
interval for all its asset triggers, keyed on the last event id it saw."""

from __future__ import annotations

import dataclasses
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from conveyor.triggers.base import Trigger, TriggerError


class AssetEvents(Protocol):
    """What serves asset triggers: the first event of `uri` recorded after `since`."""

    async def wait(self, uri: str, since: float, poll_interval: float) -> dict[str, Any]: ...


#: The asset events of the triggerer running this loop's triggers (None outside one).
ASSET_EVENTS: ContextVar[AssetEvents | None] = ContextVar("conveyor_asset_events",
                                                         default=None)


@dataclass
class AssetTrigger(Trigger):
    """Fires on the first event of `uri` (an `Asset` or its URI) recorded after `since`,
    which is when the task deferred unless given (Unix seconds, the recorder's clock)."""

    uri: str
    poll_interval: float = 1.0
    since: float = 0.0

    def __post_init__(self) -> None:
        self.uri = str(getattr(self.uri, "uri", self.uri))   # an Asset: its URI

    def serialize(self) -> tuple[str, dict[str, Any]]:
        if self.since:
            return super().serialize()
        return dataclasses.replace(self, since=time.time()).serialize()

    async def run(self) -> dict[str, Any]:
        events = ASSET_EVENTS.get()
        if events is None:
            raise TriggerError("AssetTrigger reads the state store's asset events, which "
                               "only a `conveyor triggerer` serves: run it in one")
        return await events.wait(self.uri, self.since or time.time(), self.poll_interval)
