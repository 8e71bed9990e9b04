"""Once per key with real workers: what gives a unique key back, and what does not.

The key is given back by the worker that settles its message's terminal outcome (succeeded,
failed for good, dead-lettered), never by a retry; a worker SIGKILLed mid-task gives nothing
back, so the key stays held while the message is delivered again and runs to its end. A key
held for a window (`unique_for`) is held for that window whatever the task did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.flow import UNIQUE_HEADER
from conveyor.results.handle import ResultHandle
from tests.contract.conftest import ENABLED
from tests.integration import workerkit
from tests.integration.workerkit import (
    events,
    finish,
    task_message,
    wait_event,
)
from tests.support import wait_for

pytestmark = pytest.mark.slow


class Setup(workerkit.Setup):
    def enqueue(self, task: str, *args: object, key: str = "invoice:42",
                unique_for: float = 0.0) -> ResultHandle:
        return self.client.enqueue(task_message(task, self.queue, *args), unique_key=key,
                                   unique_for=unique_for)

    def held_by(self, key: str = "invoice:42") -> str:
        """Who holds `key` now: asked by trying to take it for a probe that then lets go."""
        holder = self.client.limiter().hold(key, "probe", time.time(), 60)
        self.client.limiter().unhold(key, "probe")
        return "" if holder == "probe" else holder


@pytest.fixture(params=ENABLED)
def setup(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[Setup]:
    """A broker of each kind; keys where the workers keep them (RabbitMQ and kombu: the
    state store, a SQLite file both sides are told of)."""
    with workerkit.transport_setup(Setup, request.param, tmp_path, unique,
                                   f"u-{unique}") as made:
        yield made


def test_a_second_enqueue_publishes_nothing_and_gets_the_first_handle(setup: Setup) -> None:
    first = setup.enqueue("t.add", 1, 2)
    again = setup.enqueue("t.add", 1, 2)
    assert (first.duplicate, again.duplicate, again.id) == (False, True, first.id)
    assert first.message.headers[UNIQUE_HEADER] == "invoice:42"
    assert setup.broker.depth(setup.queue).ready == 1
    assert not setup.enqueue("t.add", 1, 2, key="invoice:43").duplicate  # another key


@pytest.mark.parametrize("task", ["t.add", "t.key_error", "t.no_such_task"])
def test_the_key_is_given_back_when_the_task_ends(setup: Setup, task: str) -> None:
    """Succeeded, failed for good (no retries left), dead-lettered (unknown task)."""
    first = setup.enqueue(task, *((1, 2) if task == "t.add" else ()))
    finish(setup.worker())
    assert setup.held_by() == ""
    after = setup.enqueue("t.add", 1, 2)
    assert not after.duplicate and after.id != first.id


def test_a_retry_keeps_the_key(setup: Setup, tmp_path: Path) -> None:
    events, tried = f"{setup.queue}-events", tmp_path / "tried"
    first = setup.client.enqueue(
        task_message("t.retry_slowly", setup.queue, str(tried), reply_to=events),
        unique_key="invoice:42")
    worker = setup.worker()
    try:
        wait_event(setup.broker, events, "retried")
        # the retry's settle is behind us once its second run has started (and waits)
        wait_for(lambda: tried.with_name("tried.second").exists(), 60,
                 "the retried task to run again")
        assert setup.held_by() == first.id
        assert setup.enqueue("t.add", 1, 2).id == first.id
    finally:
        tried.with_name("tried.go").touch()
        finish(worker)
    assert setup.held_by() == ""


def test_a_worker_killed_mid_task_keeps_the_key_through_the_redelivery(
        setup: Setup, tmp_path: Path) -> None:
    reason = getattr(setup.broker, "unsupported", {}).get("crash_redelivery")
    if reason:
        pytest.skip(f"not supported by {type(setup.broker).__name__}: {reason}")
    # a run that lasts until the test releases it: the check on the redelivered run is made
    # while it runs, however slow the machine (a 2 s run could end before the check)
    marker, release = tmp_path / "pid", tmp_path / "release"
    first = setup.enqueue("t.wait_for_file", str(marker), str(release))
    killed = setup.worker("--concurrency=1", burst=False)
    try:
        first_run = wait_for(lambda: marker.read_text(), 60, "the first run to start",
                             ignore=(FileNotFoundError,))
    finally:
        killed.kill()
        finish(killed)
    assert setup.held_by() == first.id  # nothing settled it: held while it waits again
    again = setup.worker("--concurrency=1")
    try:
        wait_for(lambda: marker.read_text() != first_run, 60, "the redelivered run to start")
        assert setup.enqueue("t.add", 1, 2).id == first.id  # held while it runs again
    finally:
        release.touch()
        finish(again)
    assert setup.held_by() == ""
    assert not setup.enqueue("t.add", 1, 2).duplicate


def test_a_window_holds_the_key_for_its_length_whatever_the_task_did(setup: Setup) -> None:
    """The task's end gives nothing back (its message does not even carry the key): the key
    is still held after its worker ran. Held for 600 s, as a window shorter than a worker's
    start and run on a loaded machine (2 s, then 6 s) could lapse first. And a window ends
    on its own: another key, held for 1 s."""
    first = setup.enqueue("t.add", 1, 2, unique_for=600)
    assert UNIQUE_HEADER not in first.message.headers  # nothing for a worker to give back
    finish(setup.worker())
    assert setup.enqueue("t.add", 1, 2, unique_for=600).id == first.id  # done, still held
    short = setup.enqueue("t.add", 1, 2, key="invoice:43", unique_for=1.0)
    assert not short.duplicate
    wait_for(lambda: not setup.held_by("invoice:43"), 30, "the 1 s window to end")
    assert not setup.enqueue("t.add", 1, 2, key="invoice:43", unique_for=1.0).duplicate


def test_a_task_enqueues_once_per_key_through_its_worker(setup: Setup) -> None:
    """A follow-up with a unique key is held where every producer holds it (the worker's
    store): the task's second enqueue is a duplicate, one `t.add` runs, and its end gives
    the key back."""
    told = f"{setup.queue}-events"
    setup.client.enqueue(task_message("t.follow_up_once", setup.queue, "invoice:42", told,
                                      reply_to=told))
    out = finish(setup.worker())
    seen = [e for e in events(setup.broker, told, timeout=2) if e.kind == "succeeded"]
    parent = next((e.result for e in seen if e.task == "t.follow_up_once"), None)
    assert parent is not None, out
    first = parent[0]
    assert parent == [first, False, first, True]
    assert [(e.message_id, e.result) for e in seen if e.task == "t.add"] == [(first, 3)]
    assert setup.held_by() == ""
