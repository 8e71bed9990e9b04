"""Dead letters (browse, re-queue, delete) and purging, through kombu's portable API."""

from __future__ import annotations

from collections.abc import Sequence

from kombu import Queue
from kombu.message import Message as KombuMessage

from conveyor.broker.bands import priority_headers, priority_of
from conveyor.broker.base import DeadLetter
from conveyor.broker.kombu.inspector import KombuInspector
from conveyor.broker.kombu.messages import dead_letter_of
from conveyor.broker.kombu.settings import DELIVERIES_HEADER, ID_HEADER, TOP_LEVEL
from conveyor.errors import BrokerError

#: Why a kombu broker cannot name the queues holding dead letters (status and dead-letters
#: list print it in their warning that the listing is partial).
CANNOT_LIST = ("a kombu transport cannot list its queues: only those in use (default, the "
               "live workers' and the runs' queues) are looked at")


class KombuAdmin(KombuInspector):
    """Dead letters and purging."""

    def dead_queues(self) -> list[str]:
        """kombu's portable API cannot list queues. Saying so (rather than []) makes `status`,
        `dead-letters list` and the dashboard warn that their listing is partial: the dead
        letters of a queue nobody consumes are otherwise hidden without a word."""
        raise BrokerError(CANNOT_LIST)

    def dead_letters(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """Browse `<queue>.dead`: take up to `limit`, then give them all back."""
        def browse() -> list[DeadLetter]:
            taken = self._take_all(self._name(queue, ".dead"), limit)
            for message in taken:
                message.requeue()
            return [dead_letter_of(queue, m) for m in taken]
        return self._call(f"listing dead letters of queue {queue!r}", browse)

    def _take_all(self, name: str, limit: int) -> list[KombuMessage]:
        """Up to `limit` messages of queue `name`, unsettled. One deleted since this object
        declared it (an operator, a listing that lagged) holds none: [], not the broker's
        404, whose closed channel is replaced (the consuming channel is another)."""
        if name not in self._declared:
            self._declare(name)
        taken: list[KombuMessage] = []
        source = Queue(name, channel=self._channel, no_declare=True)
        try:
            while len(taken) < limit:
                message = source.get(no_ack=False)
                if message is None:
                    break
                taken.append(message)
        except self._refusals as exc:
            if getattr(exc, "reply_code", None) != 404:
                raise
            self._declared.discard(name)
            self._open_channel(self._connection())
            return []  # what was taken went with the queue
        return taken

    def requeue_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Move dead letters back to `queue` as new messages with a fresh delivery count."""
        wanted = None if ids is None else set(ids)

        def move() -> int:
            moved = 0
            taken = self._take_all(self._name(queue, ".dead"), 2 ** 31)
            for message in taken:
                dead_id = dead_letter_of(queue, message).id
                if wanted is None or dead_id in wanted:
                    self._send(self._name(queue), message.body,
                               {ID_HEADER: dead_id, DELIVERIES_HEADER: 0,
                                **priority_headers(priority_of(message.headers))}, main=True)
                    message.ack()
                    moved += 1
                else:
                    message.requeue()
            return moved
        return self._call(f"re-queueing dead letters of queue {queue!r}", move)

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters of `queue`: all, or those in `ids` (the others go back)."""
        wanted = None if ids is None else set(ids)

        def delete() -> int:
            deleted = 0
            for message in self._take_all(self._name(queue, ".dead"), 2 ** 31):
                if wanted is None or dead_letter_of(queue, message).id in wanted:
                    message.ack()
                    deleted += 1
                else:
                    message.requeue()
            return deleted
        return self._call(f"deleting dead letters of queue {queue!r}", delete)

    def purge(self, queue: str) -> int:
        """Delete ready, delayed and dead messages of `queue` (held ones stay)."""
        names = [self._name(queue), self._name(queue, ".dead"),
                 *(self._level_name(queue, k) for k in range(TOP_LEVEL + 1))]

        def purge_all() -> int:
            total = 0
            for name in names:
                if name not in self._declared:
                    self._declare(name, main=name == names[0])
                total += int(self._channel.queue_purge(name) or 0)
            return total
        return self._call(f"purging queue {queue!r}", purge_all)
