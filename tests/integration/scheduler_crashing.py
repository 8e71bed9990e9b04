"""`conveyor scheduler` that kills itself with SIGKILL between claiming attempts for
publishing (committed in the state store) and publishing them: the crash the lease
recovers from, at its exact point (`Engine.before_publish`). Arguments as `conveyor
scheduler`'s. With CONVEYOR_TEST_DIE_PUBLISHING=a,b it dies only when what it is about to
publish includes one of those task ids (e.g. the task a branch just chose). With
CONVEYOR_TEST_DIE_EXPANDING=1 it dies instead in the middle of expanding a mapped task: its
instances inserted, the transaction not yet committed. With CONVEYOR_TEST_DIE_HOLDING=1 it
dies when it looks again at a task it held for want of a worker of its run's code version
(the hold committed, the task claimed by it and unpublished: scheduler/pinning.py). With
CONVEYOR_TEST_DIE_ASSETS=before_run it dies when a DAG's queued asset events are about to
start its run (the events committed, no run); with =before_consume, once that run is
inserted and before its events are consumed (the same transaction, not committed:
scheduler/asset_runs.py). With CONVEYOR_TEST_DIE_CLOSING=1 it dies when a mapped task whose
instances have all ended is closed (`Maps.closed` run, the transaction with its last
instance's outcome not committed: scheduler/mapping.py). CONVEYOR_TEST_DIE_CALLBACK=KIND:
see below."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from conveyor.cli import main
from conveyor.scheduler import engine, pinning
from conveyor.state import maps

_init = engine.Engine.__init__


def _dies_before_publishing(self: engine.Engine, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    if any(os.environ.get(f"CONVEYOR_TEST_DIE_{at}") for at in ("EXPANDING", "HOLDING",
                                                                  "CLOSING")):
        return
    at_assets = os.environ.get("CONVEYOR_TEST_DIE_ASSETS", "")
    if at_assets:
        setattr(self.asset_runs, at_assets, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
        return

    chosen = {t for t in os.environ.get("CONVEYOR_TEST_DIE_PUBLISHING", "").split(",") if t}

    def die(tis: Sequence[Any]) -> None:
        if not chosen or chosen & {ti.task_id for ti in tis}:
            os.kill(os.getpid(), signal.SIGKILL)

    # CONVEYOR_TEST_DIE_CALLBACK=KIND: die instead when publishing a callback of that kind
    # (recorded with its transition, not yet published: scheduler/callbacks.py)
    kind = os.environ.get("CONVEYOR_TEST_DIE_CALLBACK", "")

    def die_at_callback(records: Sequence[Any]) -> None:
        if any(record.kind == kind for record in records):
            os.kill(os.getpid(), signal.SIGKILL)

    if kind:
        self.callbacks.before_publish = die_at_callback
    else:
        self.before_publish = die


_insert = maps.Maps.insert_instances


def _dies_expanding(self: maps.Maps, rows: Sequence[Any]) -> None:
    _insert(self, rows)
    if os.environ.get("CONVEYOR_TEST_DIE_EXPANDING"):
        os.kill(os.getpid(), signal.SIGKILL)


_closed = maps.Maps.closed


def _dies_closing(self: maps.Maps, ti: Any, **kwargs: Any) -> bool:
    closed = _closed(self, ti, **kwargs)
    if closed and os.environ.get("CONVEYOR_TEST_DIE_CLOSING"):
        os.kill(os.getpid(), signal.SIGKILL)
    return closed


_route = pinning.Pins.route


def _dies_rechecking(self: pinning.Pins, tis: Sequence[Any], now: float) -> Any:
    if os.environ.get("CONVEYOR_TEST_DIE_HOLDING") and any(ti.waiting_for for ti in tis):
        os.kill(os.getpid(), signal.SIGKILL)
    return _route(self, tis, now)


pinning.Pins.route = _dies_rechecking  # type: ignore[method-assign]
engine.Engine.__init__ = _dies_before_publishing  # type: ignore[method-assign]
maps.Maps.insert_instances = _dies_expanding  # type: ignore[method-assign]
maps.Maps.closed = _dies_closing  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(["scheduler", *sys.argv[1:]]))
