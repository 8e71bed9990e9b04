"""The supervisor driven without a process: a fake runner pool, an in-memory broker, and
observers that record what they hear (tests/unit/worker_doubles.py). Each test runs the
real loop (`Supervisor.run`, --burst) to its end: accept, start, outcome, settle, drain."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from conveyor.errors import ConveyorError
from conveyor.events import Event
from conveyor.message import Codec, Message
from conveyor.worker.config import WorkerConfig
from conveyor.worker.followups import Publisher
from conveyor.worker.observers import Observer, Reported
from conveyor.worker.outcome import Action, Outcome
from conveyor.worker.run import Run
from conveyor.worker.supervisor import Supervisor
from tests.unit.worker_doubles import (
    EXITED_0,
    FakeCaps,
    FakePool,
    MemoryBroker,
    Script,
    succeed,
)

CODEC = Codec()
Q = "unit"


class Recorder(Observer):
    """Every hook it hears, in order, as (hook, detail)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []
        self.closed = False

    def accepted(self, run: Run) -> None:
        self.heard.append(("accepted", run.message.id))

    def rejected(self, message: Message, queue: str, reason: str) -> None:
        self.heard.append(("rejected", reason))

    def unreadable(self, queue: str, reason: str) -> None:
        self.heard.append(("unreadable", reason))

    def unrun(self, kind: str, message: Message, queue: str, reason: str) -> None:
        self.heard.append((kind, message.id))

    def starting(self, run: Run, headers: dict[str, Any]) -> None:
        headers["x-unit"] = "seen by the task"
        self.heard.append(("starting", run.message.id))

    def finished(self, run: Run, outcome: Outcome) -> Outcome:
        self.heard.append(("finished", outcome.kind))
        return outcome

    def settling(self, run: Run, outcome: Outcome, action: Action) -> Action:
        self.heard.append(("settling", action.verb))
        return action

    def settled(self, run: Run, action: Action) -> None:
        self.heard.append(("settled", action.verb))

    def released(self, run: Run) -> None:
        self.heard.append(("released", run.message.id))

    def told(self, kind: str, message: Message, queue: str, duration: float | None,
             fields: dict[str, Any]) -> None:
        if kind != "heartbeat":  # one every 0.05 s while a run is held: not a step
            self.heard.append(("told", kind))

    def close(self) -> None:
        self.closed = True

    def hooks(self, name: str) -> list[Any]:
        return [detail for hook, detail in self.heard if hook == name]


class Harness:
    """One supervisor over a MemoryBroker and a FakePool, run in --burst mode."""

    def __init__(self, script: Script = succeed, concurrency: int = 2,
                 observers: tuple[Observer, ...] = (), reported: bool = False,
                 **config: Any) -> None:
        self.broker = MemoryBroker()
        if reported:  # lifecycle events to each message's reply_to, on this broker
            observers = (*observers, Reported(self.broker, "unit-host"))
        self.recorder = Recorder()
        self.caps = FakeCaps()
        self.pools: list[FakePool] = []
        self.script, self.concurrency = script, concurrency
        cfg = WorkerConfig(queues=(Q,), concurrency=concurrency, burst=True,
                           heartbeat_interval=0.05, **config)
        self.supervisor = Supervisor(
            cfg, self.broker, CODEC, pool=self._pool, caps=self.caps,
            followups=Publisher(lambda: self.broker, CODEC),
            observers=(self.recorder, *observers))

    def _pool(self, on_change: Callable[[], None]) -> FakePool:
        pool = FakePool(on_change, lanes=self.concurrency, script=self.script)
        self.pools.append(pool)
        return pool

    @property
    def pool(self) -> FakePool:
        return self.pools[0]

    def put(self, message: Message, delivery_count: int = 1) -> Message:
        self.broker.put(Q, CODEC.encode(message), delivery_count)
        return message

    def run(self) -> int:
        return self.supervisor.run()


def message(*args: Any, **fields: Any) -> Message:
    return Message(queue=Q, command=("true",), args=args, **fields)


def test_a_task_is_accepted_started_reported_and_acked() -> None:
    h = Harness()
    m = h.put(message(7, reply_to="replies"))
    assert h.run() == 0
    assert h.broker.verbs() == ["ack"]
    [(frame, cap)] = h.pool.started
    assert frame["message"]["id"] == m.id and cap == 0
    assert frame["message"]["headers"]["x-unit"] == "seen by the task"  # `starting` hook
    assert [hook for hook, _ in h.recorder.heard] == [
        "accepted", "starting", "told", "finished", "told", "settling", "settled",
        "released"]
    assert h.recorder.hooks("told") == ["started", "succeeded"]
    assert len(h.pool.released) == 1 and h.pool.closed and h.recorder.closed
    assert h.broker.closed


def test_lifecycle_events_go_to_the_reply_to_through_the_reported_observer() -> None:
    h = Harness(reported=True)
    h.put(message(3, reply_to="replies"))
    h.run()
    events = [Event.decode(body) for body in h.broker.published["replies"]]
    assert [(e.kind, e.hostname) for e in events] == [("started", "unit-host"),
                                                       ("succeeded", "unit-host")]
    assert events[1].result == [3]


def test_a_failure_within_its_budget_is_retried_with_the_next_attempt() -> None:
    def fail(frame: dict[str, Any]) -> tuple[dict[str, Any], int]:
        return {"outcome": "failed", "reason": "boom", "error": {"type": "E"}}, EXITED_0
    h = Harness(script=fail)
    m = h.put(message(max_retries=2))
    h.run()
    [(verb, _, body, delay)] = h.broker.settled
    assert verb == "retry" and delay > 0
    assert CODEC.decode(body).attempt == m.attempt + 1
    assert h.recorder.hooks("told") == ["started", "failed", "retried"]


def test_a_failure_past_its_budget_is_dead_lettered() -> None:
    def fail(frame: dict[str, Any]) -> tuple[dict[str, Any], int]:
        return {"outcome": "failed", "reason": "boom", "error": {"type": "E"}}, EXITED_0
    h = Harness(script=fail)
    h.put(message(max_retries=0))
    h.run()
    [(verb, _, _, reason)] = h.broker.settled
    assert verb == "dead_letter" and "boom" in reason
    assert h.recorder.hooks("told") == ["started", "failed", "dead_lettered"]


def test_what_is_not_a_message_is_dead_lettered_unrun() -> None:
    h = Harness()
    h.broker.put(Q, b"not a message")
    h.run()
    [(verb, _, _, reason)] = h.broker.settled
    assert verb == "dead_letter" and reason.startswith("bad message")
    assert h.pool.started == [] and h.recorder.hooks("unreadable") == [reason]


def test_a_message_over_its_delivery_cap_is_dead_lettered_before_it_runs() -> None:
    h = Harness(max_deliveries=3)
    h.put(message(), delivery_count=4)
    h.run()
    assert h.broker.verbs() == ["dead_letter"] and h.pool.started == []
    [reason] = h.recorder.hooks("rejected")
    assert "delivered 4 times" in reason


def test_a_message_past_its_deadline_is_dead_lettered_unrun() -> None:
    h = Harness()
    m = h.put(message(expires=1.0))
    h.run()
    assert h.broker.verbs() == ["dead_letter"] and h.pool.started == []
    assert h.recorder.hooks("expired") == [m.id]


def test_an_observer_may_change_the_action_before_the_settle() -> None:
    class Requeue(Observer):
        def settling(self, run: Run, outcome: Outcome, action: Action) -> Action:
            return Action("requeue", reason="the result store is away")
    h = Harness(observers=(Requeue(),))
    h.put(message())
    h.run()
    [(verb, _, _, delay)] = h.broker.settled
    assert (verb, delay) == ("retry", 0.0)  # a requeue: ready again at once


def test_a_memory_cap_of_the_message_reaches_the_pool() -> None:
    h = Harness(memory_limit=64 << 20)
    h.put(message(memory_limit=32 << 20))
    h.put(message())
    h.run()
    assert sorted(cap for _, cap in h.pool.started) == [32 << 20, 64 << 20]


def test_a_hard_time_limit_kills_the_runner_and_the_run_times_out() -> None:
    h = Harness(script=lambda frame: None, max_retries=0)  # the task never ends by itself
    h.put(message(time_limit=0.05))
    h.run()
    [runner] = h.pool.held
    assert signal.SIGKILL in runner.signals
    [(verb, _, _, reason)] = h.broker.settled
    assert verb == "dead_letter" and "time limit" in reason
    assert "timed_out" in h.recorder.hooks("told")


def test_a_drain_lets_the_running_task_finish_and_leaves_the_rest_queued() -> None:
    h = Harness(script=lambda frame: None, concurrency=1)
    first, second = h.put(message(1)), h.put(message(2))
    start = h.pool.start

    def start_stop_and_end_soon(runner: Any, task: Any, frame: dict[str, Any],
                                cap: int) -> None:
        start(runner, task, frame, cap)
        h.supervisor._on_stop_signal(signal.SIGTERM)  # as the signal thread would
        h.supervisor.clock.at(time.monotonic() + 0.05,
                              lambda: h.pool.end(runner, {"outcome": "succeeded"}, EXITED_0))
    h.pool.start = start_stop_and_end_soon  # type: ignore[method-assign,assignment]
    assert h.run() == 0
    assert [f["message"]["id"] for f, _ in h.pool.started] == [first.id]
    assert h.broker.verbs() == ["ack"] and h.broker.paused
    assert [CODEC.decode(body).id for body, _ in h.broker.queues[Q]] == [second.id]


def test_a_drain_past_its_timeout_kills_the_task_and_requeues_it() -> None:
    h = Harness(script=lambda frame: None, drain_timeout=0.1)
    m = h.put(message())
    original_start = h.pool.start

    def start_then_stop(runner: Any, task: Any, frame: dict[str, Any], cap: int) -> None:
        original_start(runner, task, frame, cap)
        h.supervisor._on_stop_signal(signal.SIGTERM)
    h.pool.start = start_then_stop  # type: ignore[method-assign,assignment]
    assert h.run() == 0
    [(verb, _, body, delay)] = h.broker.settled
    assert (verb, delay, CODEC.decode(body).id) == ("retry", 0.0, m.id)
    assert h.recorder.hooks("told")[-1] == "interrupted"
    [runner] = h.pool.held
    assert runner.signals == [signal.SIGKILL]


def test_a_pool_failure_stops_the_worker_saying_why() -> None:
    h = Harness()
    h.put(message())
    take = h.pool.take

    def failing_take() -> Any:
        h.pool.failure = "the runner zygote exited"
        return take()
    h.pool.take = failing_take  # type: ignore[method-assign]
    with pytest.raises(ConveyorError, match="worker stopping: the runner zygote exited"):
        h.run()
    assert h.pool.closed and h.broker.closed
