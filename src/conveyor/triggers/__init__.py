"""Triggers: what a deferred task waits for without holding a worker slot.

A task raises `conveyor.Defer(trigger, timeout=...)`; its runner exits, the scheduler records
the trigger (`conveyor_triggers`), and a `conveyor triggerer` runs it (`async def run()`,
returning the payload when it fires). The task then runs again, the same attempt, with the
payload in `context.trigger_event`. See base.py for writing one's own.
"""

from conveyor.triggers.assets import AssetTrigger
from conveyor.triggers.base import Trigger, TriggerError, load
from conveyor.triggers.builtin import (
    DelayTrigger,
    FileTrigger,
    HttpTrigger,
    SqlTrigger,
    TimeTrigger,
)

__all__ = ["AssetTrigger", "DelayTrigger", "FileTrigger", "HttpTrigger", "SqlTrigger",
           "TimeTrigger", "Trigger", "TriggerError", "load"]
