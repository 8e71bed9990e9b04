"""Admin operations beyond the seam's promises: deleting dead letters (`purge_dead`).

Transports that cannot delete single dead letters yet keep the base class's default, which
says what to do instead; those are skipped here with that reason.
"""

from __future__ import annotations

import pika
import pytest

from conveyor.broker import Broker
from conveyor.broker.rabbitmq.bands import bands_high_first
from conveyor.broker.rabbitmq.ladder import dead_queue
from conveyor.errors import BrokerError
from tests.conftest import RABBITMQ_URL, delete_redis_prefix
from tests.contract.test_contract import MakeBroker, wait_for_depth
from tests.support import first, wait_for


def dead_letter_all(broker: Broker, queue: str, n: int) -> None:
    for i in range(n):
        broker.publish(queue, f"poison-{i}".encode())
    for i in range(n):
        delivery = first(broker, [queue])
        assert delivery is not None
        broker.dead_letter(delivery, f"reason {i % 2}")
    assert wait_for_depth(broker, queue, lambda d: d.dead == n).dead == n


def test_purge_dead_by_id_then_all_leaves_live_messages(make_broker: MakeBroker,
                                                         queue: str) -> None:
    broker = make_broker()
    dead_letter_all(broker, queue, 3)
    broker.publish(queue, b"alive")
    first_dead = broker.dead_letters(queue)[0]
    try:
        assert broker.purge_dead(queue, [first_dead.id]) == 1
    except BrokerError as exc:
        pytest.skip(str(exc))
    assert [d.id for d in broker.dead_letters(queue)] != [] and first_dead.id not in {
        d.id for d in broker.dead_letters(queue)}
    assert broker.purge_dead(queue) == 2
    depth = wait_for_depth(broker, queue, lambda d: d.dead == 0)
    assert (depth.dead, depth.ready) == (0, 1)


def test_every_queue_holding_dead_letters_is_listed(make_broker: MakeBroker, queue: str,
                                                    transport: str) -> None:
    """`dead-letters list` and `status` find a queue's dead letters by this, whoever
    consumes the queue (or nobody); kombu cannot list queues and says so, which the readers
    turn into a warning that the listing is partial (pass the queue with -Q)."""
    broker = make_broker()
    other = f"{queue}-nobody"
    dead_letter_all(broker, other, 1)
    broker.publish(queue, b"alive")
    if transport.startswith("kombu"):
        with pytest.raises(BrokerError, match="a kombu transport cannot list its queues"):
            broker.dead_queues()
        return
    # RabbitMQ's management statistics lag a few seconds behind the queues
    listed = wait_for(lambda: other in broker.dead_queues() and broker.dead_queues(),
                      timeout=30, what=f"{other} among the queues with dead letters")
    assert queue not in listed
    broker.purge_dead(other)
    wait_for(lambda: other not in broker.dead_queues(), timeout=30,
             what=f"{other} gone from the queues with dead letters once purged")


def test_a_queue_deleted_after_it_was_listed_has_no_dead_letters(
        make_broker: MakeBroker, queue: str, transport: str, unique: str) -> None:
    """`dead-letters list` reads the dead letters of each queue `dead_queues` named; one
    deleted in between (its owner's teardown, an operator; RabbitMQ's listing lags seconds
    behind) has none: [] and nothing to requeue, not the broker's 404."""
    broker = make_broker()
    dead_letter_all(broker, queue, 1)
    if not transport.startswith("kombu"):   # kombu cannot list queues (see above)
        wait_for(lambda: queue in broker.dead_queues(), timeout=30,
                 what=f"{queue} among the queues with dead letters")
    delete_queue(transport, broker, queue, unique)
    assert broker.dead_letters(queue) == []
    assert broker.requeue_dead(queue) == 0   # the broker object still answers
    assert broker.purge_dead(queue) == 0


def delete_queue(transport: str, broker: Broker, queue: str, unique: str) -> None:
    """Delete `queue` the way its server can: the queues themselves on RabbitMQ, the keys
    on Redis; on SQL a queue is only its rows."""
    if transport == "rabbitmq":
        delete_amqp_queues([*bands_high_first(queue), dead_queue(queue)])
    elif transport == "kombu+amqp":
        delete_amqp_queues([f"{unique}.{queue}", f"{unique}.{queue}.dead"])
    elif transport in ("redis", "kombu+redis"):
        delete_redis_prefix(unique)
    else:
        broker.purge(queue)


def delete_amqp_queues(names: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)
    finally:
        connection.close()
