"""Cancel: the durable record of what was cancelled, and the channel that carries a cancel
to the worker holding the message.

The record (`Limiter.cancel`) lives in flow control's store beside the unique keys (the
broker's own for Redis, Postgres and SQLite; the state store, or CONVEYOR_LIMITS_URL, for
RabbitMQ and kombu), so it survives worker and producer restarts and is honoured whenever
the message is delivered, again or for the first time. Each record lapses `CANCEL_TTL`
seconds after it was made: a backstop, so records do not pile up for ever.

A worker keeps every live id in memory (`watch.CancelWatch`): it reads the records once at
start, then hears new ones on the control channel (`channel.py`), so checking a delivery
costs a set lookup, not a round trip on the claim path. `Client.cancel` is the one entry
point that writes a record and announces it; the CLI, the dashboard and the Celery intake
call it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from conveyor.message import Message

#: How long a cancel record is kept (seconds): a message delivered later than this after
#: its cancel (a long delay, a long outage) runs after all.
CANCEL_TTL = 7 * 86400.0


class CancelResult(enum.Enum):
    """What `Client.cancel` did."""

    #: recorded: it will not start, and a worker running it stops it
    CANCELLED = "cancelled"
    #: it was cancelled already: nothing changed
    ALREADY_CANCELLED = "already_cancelled"
    #: its outcome is in the result store already: nothing changed
    FINISHED = "finished"

    def describe(self, message_id: str) -> str:
        """One line for people (the CLI prints it)."""
        return {
            CancelResult.CANCELLED: f"{message_id} cancelled: it will not start, and a "
                                    "worker running it stops it",
            CancelResult.ALREADY_CANCELLED: f"{message_id} was cancelled already: nothing "
                                            "changed",
            CancelResult.FINISHED: f"{message_id} has finished already: nothing changed",
        }[self]


def attempt_ref(ti_id: str, attempt: int) -> str:
    """The id a DAG task attempt is cancelled by: every message of the attempt carries it
    as its `run_id` (the scheduler may publish an attempt again under a new message id, after
    a crash or a redelivery past its deadline), so one record stops them all."""
    return f"{ti_id}/{attempt}"


def unstarted_ref(message_id: str) -> str:
    """The id that cancels `message_id` only if it has not started (Celery's `revoke()`
    without terminate): a worker refuses it when delivered, a run in progress goes on."""
    return f"{message_id}:unstarted"


class Ids(Protocol):
    """What cancel records are looked up in: a set, or a worker's `CancelWatch`."""

    def __contains__(self, message_id: str, /) -> bool: ...


def names(ids: Ids, message: Message, *, started: bool) -> bool:
    """Whether a cancel record in `ids` names `message`: by its own id, by its attempt's
    (`attempt_ref`, a DAG task attempt: `settle: report`), or, if it has not `started`, by
    its `unstarted_ref`. Checked for every delivery a worker takes: plain lookups, no
    allocation but the unstarted ref's string."""
    if message.id in ids:
        return True
    if message.run_id and message.run_id in ids and message.headers.get("settle") == "report":
        return True
    return not started and unstarted_ref(message.id) in ids


__all__ = ["CANCEL_TTL", "CancelResult", "attempt_ref", "names", "unstarted_ref"]
