"""Queue names, their arguments, and delays without plugins: the delay ladder.

**Delays without plugins** (the delayed-message plugin is not part of RabbitMQ). A per-message
TTL only expires at the head of its queue, so one delay queue would hold a short delay behind
a long one. Instead each queue gets a ladder of delay levels, as in NServiceBus's delayed
delivery: level `k` is the quorum queue `<queue>.delay.<k>` whose per-queue TTL is
`0.25 s * 2**k` (one TTL per queue, so it is FIFO and expires in order), for k = 0..24. A delay
is rounded *up* to whole quarter seconds (never early) and written in binary into the routing
key, one word per level, highest first, then a token naming the destination:
`0.0.….1.1.0.<token>`. A topic exchange per level (`conveyor.delay.<k>`) routes a message
whose bit k is 1 into `<queue>.delay.<k>` and one whose bit k is 0 on to the next exchange
down (an exchange-to-exchange binding). When the level's TTL expires, the message is
dead-lettered (at-least-once) to the exchange one level down with the same key; level 0 and a
0 at exchange 0 lead into `<queue>`. A message therefore waits exactly the sum of the levels
of its 1 bits, walking down until due. Everything is durable on the broker; no consumer ever
holds a delayed message. Levels are declared when a delay first needs them, so a queue only
gets the levels its delays use (jittered retry delays touch most levels up to their size:
expect 10-20 level queues for a queue that retries with backoff). The longest delay is
about 97 days (each level's TTL is kept under 2**32 ms); longer ones raise `BrokerError`.
Per-queue levels cost queues but are what makes `delayed` exact per queue; a ladder shared
by all queues (NServiceBus's) would need only 25 but could only count delays vhost-wide.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from conveyor.errors import BrokerError
from conveyor.kinds import is_pinned_queue

#: The delay ladder: level k waits DELAY_UNIT_MS * 2**k; the top level's TTL fits 2**32 ms.
DELAY_UNIT_MS = 250
DELAY_LEVELS = 25
MAX_DELAY = ((1 << DELAY_LEVELS) - 1) * DELAY_UNIT_MS / 1000
#: Queue names leave room for the reserved suffixes inside AMQP's 255-byte limit.
MAX_QUEUE_NAME_BYTES = 200


def dead_queue(queue: str) -> str:
    return f"{queue}.dead"


def level_queue(queue: str, level: int) -> str:
    return f"{queue}.delay.{level}"


def level_exchange(level: int) -> str:
    return f"conveyor.delay.{level}"


def destination_token(queue: str) -> str:
    """One routing-key word naming `queue`: a hash, so dots or `*`/`#` in names are harmless."""
    return hashlib.blake2b(queue.encode(), digest_size=10).hexdigest()


def delay_units(delay: float) -> int:
    """`delay` seconds in ladder units, rounded up so a message is never early."""
    if delay <= 0:
        return 0
    if delay > MAX_DELAY:
        raise BrokerError(f"a delay of {delay:.0f} s is longer than RabbitMQ's delay ladder "
                          f"allows ({MAX_DELAY:.0f} s, about 97 days): schedule it instead")
    return max(1, math.ceil(delay * 1000 / DELAY_UNIT_MS))


def delay_key(units: int, queue: str) -> str:
    """The routing key: one word per level, highest first, then the destination token."""
    return ".".join(format(units, f"0{DELAY_LEVELS}b")) + "." + destination_token(queue)


def level_pattern(level: int, bit: str, tail: str) -> str:
    """Binding key matching bit `level` == `bit`, any other bits, then `tail`."""
    words = ["*"] * DELAY_LEVELS
    words[DELAY_LEVELS - 1 - level] = bit
    return ".".join([*words, tail])


def set_levels(units: int) -> list[int]:
    return [k for k in range(units.bit_length()) if units >> k & 1]


def queue_arguments(queue: str, delivery_limit: int, consumer_timeout: float,
                    expires: float = 0.0) -> dict[str, Any]:
    return {"x-queue-type": "quorum", "x-delivery-limit": delivery_limit,
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_queue(queue),
            "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
            "x-consumer-timeout": int(consumer_timeout * 1000), **expiry(queue, expires)}


def dead_arguments(queue: str = "", expires: float = 0.0) -> dict[str, Any]:
    # Browsing returns dead letters with a nack, which counts as a delivery: RabbitMQ 4 caps
    # quorum queues at 20 by default, so lift the cap explicitly (harmless on 3.x).
    return {"x-queue-type": "quorum", "x-delivery-limit": 2**31 - 1,
            **expiry(queue, expires)}


def level_arguments(queue: str, level: int, expires: float = 0.0) -> dict[str, Any]:
    args: dict[str, Any] = {
        "x-queue-type": "quorum", "x-message-ttl": DELAY_UNIT_MS << level,
        "x-dead-letter-exchange": level_exchange(level - 1) if level else "",
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        **expiry(queue, expires)}
    if level == 0:
        args["x-dead-letter-routing-key"] = queue
    return args


def expiry(queue: str, expires: float) -> dict[str, Any]:
    """`x-expires` for the queues of a per-version queue (`<queue>@<version>`, README "Runs
    pinned to their code"): RabbitMQ deletes each once it has had no consumer for `expires`
    seconds, so the versions of past deploys leave nothing behind. Whatever one held then
    is lost with it, and the scheduler publishes that attempt again (pinning.py). Every
    other queue never expires."""
    return {"x-expires": int(expires * 1000)} if expires > 0 and is_pinned_queue(queue) \
        else {}


def validate_queue_name(queue: str) -> None:
    size = len(queue.encode())
    if not queue or size > MAX_QUEUE_NAME_BYTES or queue.startswith("amq."):
        raise BrokerError(f"queue name {queue!r} cannot be used on RabbitMQ: it must be 1 to "
                          f"{MAX_QUEUE_NAME_BYTES} bytes and not start with 'amq.'")
