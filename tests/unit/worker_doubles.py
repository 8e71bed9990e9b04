"""Test doubles for driving a `Supervisor` in a unit test: no service, no fork.

`MemoryBroker` is a small in-memory `Consumer` (the broker contract suite is what proves the
real ones); `FakePool` stands in for the runner pool, its runners ending as a script says
the moment they are handed a task, or when signalled; `FakeCaps` are memory caps that cap
nothing. Each records what the supervisor did to it.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from conveyor.broker import Delivery, Publication
from conveyor.worker.cgroups import MemoryCaps, Slot
from conveyor.worker.pool import Lane, Runner, Task

#: A runner's exit statuses, as waitpid gives them.
EXITED_0 = 0
KILLED = signal.SIGKILL


class MemoryBroker:
    """Queues in a dict; every settle is recorded as (verb, queue, body, detail)."""

    lease_seconds = 30.0
    weaker_guarantees = ""
    leases = True          # self-fencing renews lease_until, as on Redis, Postgres, SQLite
    fence_seconds = lease_seconds

    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[bytes, int]]] = {}
        self.settled: list[tuple[str, str, bytes, Any]] = []
        self.published: dict[str, list[bytes]] = {}
        self.paused = self.closed = False

    def put(self, queue_name: str, body: bytes, delivery_count: int = 1) -> None:
        self.queues.setdefault(queue_name, deque()).append((body, delivery_count))

    # -- producing
    def publish(self, queue: str, body: bytes, *, priority: int = 0,
                delay: float = 0.0) -> None:
        self.published.setdefault(queue, []).append(body)

    def publish_many(self, publications: Sequence[Publication]) -> None:
        for p in publications:
            self.publish(p.queue, p.body, priority=p.priority, delay=p.delay)

    # -- consuming
    def consume(self, queues: Sequence[str], *, prefetch: int = 1, timeout: float = 1.0,
                ahead: int = 0) -> Generator[Delivery | None, float | None, None]:
        while True:
            yield None if self.paused else self._claim(queues)

    def _claim(self, queues: Sequence[str]) -> Delivery | None:
        for name in queues:
            waiting = self.queues.get(name)
            if waiting:
                body, count = waiting.popleft()
                return Delivery(name, body, count, receipt=object())
        return None

    def claim_more(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        return []

    claimed_ahead = 0
    outstanding = 0
    owed_for = None  # settles are sent at once: none is ever owed

    def send_owed(self) -> bool:
        return False

    def give_back_claimed(self) -> None:
        return None

    def renew_claimed(self, seconds: float | None = None) -> None:
        return None

    # -- settling
    def ack(self, delivery: Delivery) -> None:
        self.settled.append(("ack", delivery.queue, delivery.body, None))

    ack_soon = ack

    def ack_many(self, deliveries: Sequence[Delivery]) -> list[Delivery]:
        for delivery in deliveries:
            self.ack(delivery)
        return []

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        self.settled.append(("retry", delivery.queue, body or delivery.body, delay))

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.settled.append(("dead_letter", delivery.queue, delivery.body, reason))

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        return None

    def is_empty(self, queues: Sequence[str]) -> bool:
        return not any(self.queues.get(name) for name in queues)

    def pause(self, *, wake: bool = True) -> None:
        self.paused = True

    def wakeup(self) -> None:
        return None

    def stop_retrying(self, *, wake: bool = True) -> None:
        return None

    def hold_connections_with(self, hold: Callable[[socket.socket], None]) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def verbs(self) -> list[str]:
        return [verb for verb, _, _, _ in self.settled]


class FakeSlot(Slot):
    def set_limit(self, memory_limit: int) -> None:
        self.memory_limit = memory_limit


class FakeCaps(MemoryCaps):
    kind = "fake"

    def describe(self) -> str:
        return "none (a unit test)"

    def _new_slot(self, name: str, memory_limit: int) -> Slot:
        return FakeSlot(name, memory_limit, self._forget)


class FakeRunner(Runner):
    """A runner that is only a record: `signal` ends its run as the kernel would."""

    def __init__(self, pool: FakePool, pid: int, lane: Lane) -> None:
        super().__init__(pid=pid, pidfd=-1, channel=None, output=-1,  # type: ignore[arg-type]
                         lane=lane)
        self.pool = pool
        self.signals: list[int] = []

    def signal(self, signum: int) -> None:
        self.signals.append(signum)
        if signum == signal.SIGKILL:
            self.pool.end(self, None, KILLED)


#: What a runner reports for a task frame, and its exit status; None: it keeps running.
Script = Callable[[dict[str, Any]], tuple[dict[str, Any] | None, int] | None]


def succeed(frame: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
    return {"outcome": "succeeded", "result": frame["message"]["args"] or None}, EXITED_0


class FakePool:
    """The supervisor's side of `Pool`, with runners that are records (one per task)."""

    def __init__(self, on_change: Callable[[], None], lanes: int = 2,
                 script: Script = succeed) -> None:
        self.on_change = on_change
        self.script = script
        self.failure: str | None = None
        self.teardown = "ordinary priority (a fake pool)"
        self.finished: queue.SimpleQueue[Runner] = queue.SimpleQueue()
        caps = FakeCaps()
        self.lanes = [Lane(i, None, caps.prepare(f"lane{i}", 0))  # type: ignore[arg-type]
                      for i in range(lanes)]
        self.started: list[tuple[dict[str, Any], int]] = []  # (frame, memory cap)
        self.released: list[Runner] = []
        self.held: list[FakeRunner] = []  # running, not ended by the script
        self.closed = False
        self._pids = iter(range(1000, 100000))

    def take(self) -> Runner | None:
        for lane in self.lanes:
            if lane.busy is None:
                lane.busy = FakeRunner(self, next(self._pids), lane)
                return lane.busy
        return None

    def start(self, runner: Runner, task: Task, frame: dict[str, Any],
              memory_limit: int) -> None:
        runner.task, runner.started = task, time.monotonic()
        self.started.append((frame, memory_limit))
        ending = self.script(frame)
        if ending is None:
            assert isinstance(runner, FakeRunner)
            self.held.append(runner)
        else:
            self.end(runner, *ending)

    def end(self, runner: Runner, report: dict[str, Any] | None, status: int) -> None:
        """The runner reports and exits: its run is handed to the supervisor."""
        if runner.task is None or runner.handed_over:
            return
        runner.report, runner.status = report, status
        runner.handed_over, runner.ended = True, time.monotonic()
        self.finished.put(runner)
        self.on_change()

    @contextlib.contextmanager
    def live(self, runner: Runner, task: Task) -> Iterator[bool]:
        yield runner.task is task and not runner.handed_over

    def hold(self, connection: socket.socket) -> None:
        return None

    def usage(self) -> list[tuple[Lane, Task | None, int | None]]:
        return [(lane, lane.busy.task if lane.busy else None, 0) for lane in self.lanes]

    def oom_killed(self, runner: Runner) -> bool:
        return False

    def release(self, runner: Runner) -> None:
        assert runner.lane is not None
        runner.task = None
        runner.lane.busy = None
        self.released.append(runner)

    def abandon(self, runner: Runner) -> None:
        self.release(runner)

    def close(self) -> None:
        self.closed = True

