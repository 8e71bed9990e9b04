"""The gate's batch parking (`Gate.park_behind`) over a real SQLite broker and limiter."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from conveyor.broker import Delivery, Depth, Publication, from_url
from conveyor.flow import Spec, limits_of
from conveyor.limits import Parcel
from conveyor.limits.sql import SQLiteLimiter
from conveyor.message import Codec, Message
from conveyor.worker.flow import Gate
from tests import flow_tasks

CODEC = Codec()


def vet(delivery: Delivery) -> tuple[Message, list[Spec]]:
    message = CODEC.decode(delivery.body)
    return message, limits_of(message.headers)


def backlog(url: str, tenants: Sequence[str]) -> None:
    with from_url(url) as broker:
        broker.publish_many([Publication("q", CODEC.encode(flow_tasks.tenant_job.message(
            (t, "/dev/null"), queue="q"))) for t in tenants])


def fill(url: str, key: str) -> None:
    """Two holders take the key's two tokens, as two running tasks would."""
    store = SQLiteLimiter(url)
    for holder in ("h1", "h2"):
        assert store.admit(Parcel(holder, "q", b"{}"), [Spec("c", key, max=2)], time.time(),
                           600).granted
    store.close()


def test_the_full_key_s_messages_are_parked_and_acked_and_the_others_left(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    fill(url, "tenant:a")
    backlog(url, ["a"] * 6 + ["b"] + ["a"] * 3)
    broker = from_url(url)
    gate = Gate(lambda: SQLiteLimiter(url), broker, CODEC)
    steps = broker.consume(["q"], prefetch=1, timeout=5)
    first = next(steps)
    assert first is not None
    left = gate.park_behind(["q"], vet)
    assert [vet(d)[0].args[0] for d in left] == ["b"]  # the others of the batch: parked
    assert broker.outstanding == 2 and broker.depth("q") == Depth(0, 2, 0, 0)
    assert gate.waiting() == 8
    gate.close()
    broker.close()


def test_a_batch_the_store_cannot_park_is_handed_back_whole(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    backlog(url, ["a"] * 5)

    class Locked(SQLiteLimiter):
        def park_many(self, items: Sequence[tuple[Parcel, Sequence[Spec]]],
                      now: float) -> list[str]:
            raise sqlite3.OperationalError("database is locked")

    broker = from_url(url)
    gate = Gate(lambda: Locked(url), broker, CODEC)
    steps = broker.consume(["q"], prefetch=1, timeout=5)
    assert next(steps) is not None
    left = gate.park_behind(["q"], vet)
    assert len(left) == 4  # every one claimed, none acked: the caller handles each
    assert broker.outstanding == 5 and broker.depth("q") == Depth(0, 5, 0, 0)
    gate.close()
    broker.close()
