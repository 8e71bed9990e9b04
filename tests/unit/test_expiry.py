"""`expires=` on enqueue and on tasks, and what a requeue of a dead letter does with it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conveyor import client as clients
from conveyor.broker import Broker, from_url
from conveyor.client import Client
from conveyor.errors import ConfigError
from conveyor.message import Codec, Message, deadline
from conveyor.readers.deadletters import requeue
from tests.support import first


@pytest.fixture(autouse=True)
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    made = Client(from_url(f"sqlite:///{tmp_path}/broker.db"))
    monkeypatch.setattr(clients, "_default", made)
    yield made
    made.close()


def test_deadline_takes_seconds_from_now_or_a_time() -> None:
    assert deadline(60, 1000.0) == 1060.0
    at = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert deadline(at, at.timestamp() - 5) == at.timestamp()
    assert deadline(at.replace(tzinfo=None), at.timestamp() - 5) == at.timestamp()  # UTC


@pytest.mark.parametrize("bad", [0, -1, True, "60"])
def test_deadline_refuses_what_is_not_a_time_to_start_in_one_line(bad: object) -> None:
    with pytest.raises(ConfigError, match="give seconds from now"):
        deadline(bad, 1000.0)  # type: ignore[arg-type]


def test_deadline_not_after_the_delay_is_refused() -> None:
    with pytest.raises(ConfigError, match="would expire before it may run"):
        deadline(5, 1000.0, delay=5)
    with pytest.raises(ConfigError, match="would expire before it may run"):
        deadline(datetime.now(UTC) - timedelta(seconds=1), datetime.now(UTC).timestamp())


def test_enqueue_takes_expires_for_itself_and_the_tasks_own_is_the_default() -> None:
    from conveyor.tasks import task

    @task(name="x.stale", expires=30)
    def stale(a: int) -> None:
        """Must start within 30 s of its enqueue."""

    own = stale.enqueue(1).message
    given = stale.enqueue(2, expires=5).message
    at = datetime.now(UTC) + timedelta(minutes=2)
    timed = stale.enqueue_with((3,), expires=at).message
    assert own.kwargs == {} and given.kwargs == {}
    assert own.expires - own.enqueued_at == pytest.approx(30)
    assert given.expires - given.enqueued_at == pytest.approx(5)
    assert timed.expires == pytest.approx(at.timestamp())


def dead_letter(broker: Broker, message: Message) -> None:
    broker.publish(message.queue, Codec().encode(message))
    delivery = first(broker, [message.queue])
    assert delivery is not None
    broker.dead_letter(delivery, "expired: not started by its deadline")


def taken(broker: Broker, count: int) -> list[bytes]:
    """The bodies of the next `count` messages of queue q."""
    bodies = []
    for _ in range(count):
        delivery = first(broker, ["q"])
        assert delivery is not None
        broker.ack(delivery)
        bodies.append(delivery.body)
    return bodies


def test_a_requeued_dead_letter_gets_its_time_to_start_again_and_keeps_its_attempt(
        client: Client) -> None:
    """Requeued as it was, an expired message would be dead-lettered again at once."""
    broker = client.broker
    dead_letter(broker, Message(queue="q", task="t", attempt=3, enqueued_at=100.0,
                                expires=130.0))
    dead_letter(broker, Message(queue="q", task="t", attempt=3))   # no expires: as it was
    assert requeue(broker, "q", None, Codec()) == (2, 0)
    back = [Codec().decode(body) for body in taken(broker, 2)]
    timed = next(m for m in back if m.expires)
    assert timed.expires - timed.enqueued_at == pytest.approx(30.0)
    assert not timed.expired(timed.enqueued_at + 29)
    assert [m.attempt for m in back] == [3, 3]


def test_a_fresh_requeue_also_starts_at_attempt_1(client: Client) -> None:
    broker = client.broker
    dead_letter(broker, Message(queue="q", task="t", attempt=3, enqueued_at=100.0,
                                expires=130.0))
    broker.publish("q", b"not a message")
    delivery = first(broker, ["q"])
    assert delivery is not None
    broker.dead_letter(delivery, "bad message")
    assert requeue(broker, "q", None, Codec(), fresh=True) == (2, 1)
    back = taken(broker, 2)
    assert b"not a message" in back
    [again] = [Codec().decode(b) for b in back if b != b"not a message"]
    assert (again.attempt, again.expired(again.enqueued_at + 29)) == (1, False)
