"""Admin operations beyond the seam's promises: deleting dead letters (`purge_dead`).

Transports that cannot delete single dead letters yet keep the base class's default, which
says what to do instead; those are skipped here with that reason.
"""

from __future__ import annotations

import pytest

from conveyor.broker import Broker
from conveyor.errors import BrokerError
from tests.contract.test_contract import MakeBroker, wait_for_depth
from tests.support import first


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
