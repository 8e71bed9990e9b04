"""Priorities on quorum queues: one quorum queue per priority band.

Quorum queues (RabbitMQ 3.10) have no message priorities, so each Conveyor queue is served
by four queues, one per band of `conveyor.broker.bands` (0: priority 0 and below; 1: 1-3;
2: 4-6; 3: 7 and above), and a consumer consumes every band of a queue and hands out a
higher band's delivery before a lower one's:

| band | queue |
|---|---|
| 0 | `<queue>` itself |
| 1, 2, 3 | `<queue>.pri.1`, `<queue>.pri.2`, `<queue>.pri.3` |

Band 0 is the queue that always existed, so unprioritised traffic takes exactly the path it
took before bands: the same queue, the same consumer, nothing asked of the other bands
(see `_may_hold` in `broker`).

**What is guaranteed.** Within a band, FIFO (priorities 4 and 6 are equals). Across bands,
a consumer hands out a higher band's message before any lower-band message it had not
already read ahead when the higher one arrived: at most `prefetch + ahead` lower-band
messages (the consumer's qos window, the worker's read-ahead) start after a higher one was
published. A band that sent this consumer a message since a look found it empty, or whose
consumer has used up its credit, is checked with a passive declare (then the push is awaited,
or a `basic.get` takes it) before a lower band is served, so a busy high band never lets low
work in. Several consumers each keep this for what they were sent; RabbitMQ spreads each
band among them.
"""

from __future__ import annotations

from functools import lru_cache

from conveyor.broker.bands import TOP_BAND


def band_queue(queue: str, band: int) -> str:
    """The quorum queue holding `queue`'s messages of `band` (band 0: `queue` itself)."""
    return queue if band == 0 else f"{queue}.pri.{band}"


@lru_cache(maxsize=1024)
def bands_high_first(queue: str) -> tuple[str, ...]:
    """Every band queue of `queue`, in the order a consumer serves them (asked on every
    claim: cached)."""
    return tuple(band_queue(queue, band) for band in range(TOP_BAND, -1, -1))


def even_units(units: int, band: int) -> int:
    """A delay in ladder units a band queue can be reached with.

    The ladder's level 0 dead-letters into `<queue>` by name (its routing-key argument), so
    a message for a higher band must not pass through it: its delay is rounded up to an
    even number of units (at most 0.25 s later; never early). Bands > 0 are bound at the
    ladder's exchange 0 with their own destination token instead.
    """
    return units + (units & 1) if band else units
