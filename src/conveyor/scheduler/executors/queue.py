"""The queue executor (the default): publish the attempt to its named queue on the broker.

Workers consume it, run it in their isolated runner, and publish its events to
`message.reply_to`, the scheduler's events queue. The message says `max_retries=0` and
carries the header `settle: report`, so a worker reports a failure instead of retrying or
dead-lettering it: retries of DAG tasks are the scheduler's.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.client import Client
from conveyor.errors import MessageError
from conveyor.scheduler.errors import ExecutorError
from conveyor.scheduler.executors import Executor, Workload


class QueueExecutor(Executor):
    name = "queue"

    def __init__(self, client: Client) -> None:
        self.client = client

    def submit(self, workload: Workload) -> None:
        try:
            self.client.enqueue(workload.message)
        except MessageError as exc:
            raise ExecutorError(str(exc)) from None

    def submit_many(self, workloads: Sequence[Workload]
                    ) -> list[tuple[Workload, ExecutorError]]:
        """Every message in one publish batch (one transaction or round trip, one wake-up
        of the workers), where the transport can; a message that cannot be encoded (over
        the size cap) is refused, the others go."""
        refused: list[tuple[Workload, ExecutorError]] = []
        publications = []
        for workload in workloads:
            try:
                publications.append(self.client.publication(workload.message))
            except MessageError as exc:
                refused.append((workload, ExecutorError(str(exc))))
        self.client.broker.publish_many(publications)
        return refused

    def close(self) -> None:
        self.client.close()
