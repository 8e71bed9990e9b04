"""Expiry on every transport: a message past its `expires` is dead-lettered `expired`, unrun.

A real `conveyor worker --burst` takes three messages: one past its `expires` (dead-lettered
with reason `expired`, never started), one within it (runs), and a DAG attempt past it
(`settle: report`: acked unrun and reported, not dead-lettered: the scheduler has moved the
run past that attempt). Then `requeue` of the dead letter gives it its time to start again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor.broker import Broker
from conveyor.message import Codec, Message
from conveyor.readers.deadletters import requeue
from tests.contract.test_contract import MakeBroker
from tests.integration.workerkit import (
    enqueue,
    events,
    finish,
    start_worker,
    task_message,
    worker_env,
)
from tests.support import first

pytestmark = pytest.mark.slow


def test_an_expired_message_is_dead_lettered_unrun_and_an_unexpired_one_runs(
        make_broker: MakeBroker, broker_url: str, queue: str, tmp_path: Path) -> None:
    broker, ledger, replies = make_broker(), tmp_path / "ledger", f"{queue}-replies"
    now = time.time()
    sent = {token: enqueue(broker, task_message(
        "t.record", queue, str(ledger), token, reply_to=replies, expires=now + ahead,
        headers=headers)) for token, ahead, headers in (
            ("stale", 0.3, {}), ("fresh", 600, {}), ("attempt", 0.3, {"settle": "report"}))}
    time.sleep(0.5)
    out = finish(start_worker(broker_url, queue, env=worker_env(broker_url)))
    ran = ledger.read_text()
    assert "done fresh" in ran and "stale" not in ran and "attempt" not in ran, out
    [dead] = broker.dead_letters(queue)
    assert Codec().decode(dead.body).id == sent["stale"].id
    assert dead.reason.startswith("expired: not started by its deadline"), dead.reason
    kinds = {(e.message_id, e.kind) for e in events(broker, replies)}
    for token in ("stale", "attempt"):
        assert (sent[token].id, "expired") in kinds, (token, kinds)
        assert (sent[token].id, "started") not in kinds, (token, kinds)
    assert requeued_runs_in_time(broker, queue) == sent["stale"].id


def requeued_runs_in_time(broker: Broker, queue: str) -> str:
    """Requeue the dead letters: the message comes back with its time to start (0.3 s)
    counted again from the requeue (a worker taking it within that runs it), its attempt
    kept; its id."""
    before = time.time()
    assert requeue(broker, queue, None, Codec()) == (1, 0)
    assert broker.dead_letters(queue) == []
    delivery = first(broker, [queue], timeout=10)
    assert delivery is not None
    broker.ack(delivery)
    message: Message = Codec().decode(delivery.body)
    assert before <= message.enqueued_at <= time.time()
    assert message.expires - message.enqueued_at == pytest.approx(0.3, abs=0.01)
    assert message.attempt == 1
    return message.id
