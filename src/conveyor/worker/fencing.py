"""Self-fencing: a worker that cannot renew a delivery's lease stops its runner before the
lease lapses, so that the run another worker starts once it has lapsed never overlaps this one.

Why: on a transport whose leases lapse by time (Redis, Postgres, SQLite) a delivery is handed
to another consumer when its lease runs out, whether or not its worker still lives. A worker
cut off from the broker (a network partition, a broker that hangs) cannot renew, and without
this its runner would go on running the task while another worker runs it again: two runs of
one attempt at once, each writing what the task writes.

How: each delivery carries `lease_until` (broker/base.py), the moment its lease lapses at the
earliest as this process reckons it: when the claim or the last renewal was *sent*, plus the
lease. The broker started its lease when the request arrived, later, so its own end is no
sooner. A timer on the worker's clock (worker/clock.py: a thread that never waits on the
broker) comes due `margin(lease)` seconds before that end; if a renewal moved it meanwhile,
the timer is set again for the new end, else it SIGKILLs the runner (through its pidfd) and
says so in the log. The run then ends as `interrupted` (reason: self-fenced) and is requeued,
its settle held until the broker answers (worker/outage.py); by then the message is usually
another worker's, and the settle is refused (`LeaseLost`), as is any late ack.

A run not started yet whose lease is that close to its end is not started (`lapsing`).

RabbitMQ (`amqp://`): a delivery is bound to its connection, which RabbitMQ closes (and so
requeues the delivery) no sooner than two heartbeat timeouts after it last read from it. The
transport stamps `lease_until` itself from round trips on the connection
(broker/rabbitmq/liveness.py), so `renewed` leaves it alone (`renews=False`), and the lease
reckoned with is `Broker.fence_seconds` (two heartbeat timeouts). It is renewed on the
worker's heartbeat, so a heartbeat timeout too short for the worker's interval would fence
runs that are fine: then fencing is off, with a WARNING (`fits`). kombu keeps `lease_until`
infinite and is never fenced; see the README, "What each broker guarantees under a
partition".
"""

from __future__ import annotations

import logging
import math
import signal
import time

from conveyor.broker import Delivery
from conveyor.worker.clock import Clock
from conveyor.worker.pool import RunnerPool
from conveyor.worker.run import Run

log = logging.getLogger("conveyor.worker")


def margin(lease_seconds: float) -> float:
    """Seconds before a lease's reckoned end at which an unrenewed run is stopped: a sixth of
    the lease, at least half a second (a kill and a loaded machine's scheduling delay), at
    most half the lease. With the default 10 s heartbeat (a 30 s lease): 5 s."""
    return min(lease_seconds / 2, max(0.5, lease_seconds / 6))


def fits(lease_seconds: float, renew_every: float) -> bool:
    """Whether a transport-stamped lease (RabbitMQ) outlasts a renewal interval with room:
    the proof a renewal stamps is up to a quarter of a heartbeat timeout (an eighth of the
    lease) and a second of loop latency old, and the run is stopped `margin` before the end."""
    return renew_every + lease_seconds / 8 + 1.0 <= lease_seconds - margin(lease_seconds)


class SelfFence:
    """Watches the leases of the runs a supervisor starts; see the module docstring."""

    def __init__(self, clock: Clock, pool: RunnerPool, lease_seconds: float,
                 renews: bool = True, renew_every: float = 0.0) -> None:
        self.clock = clock
        self.pool = pool
        self.lease_seconds = lease_seconds
        self.margin = margin(lease_seconds)
        #: whether `renewed` stamps `lease_until` (False: the transport does, see above)
        self.renews = renews
        self.on = renews or not math.isfinite(lease_seconds) or fits(lease_seconds, renew_every)
        if not self.on:
            log.warning("self-fencing is off: the broker's lease (%.1f s: two heartbeat "
                        "timeouts of the connection) is too short for the worker's heartbeat "
                        "interval (%.1f s), so runs that are fine would be stopped; raise the "
                        "broker URL's heartbeat or lower --heartbeat-interval", lease_seconds,
                        renew_every)

    def watch(self, run: Run) -> None:
        """Called as `run` starts (main thread): check its lease before it lapses."""
        if self.on and math.isfinite(run.delivery.lease_until):
            run.timers.append(self.clock.at(run.delivery.lease_until - self.margin,
                                            lambda: self._due(run)))

    def renewed(self, delivery: Delivery, since: float) -> None:
        """Its lease was renewed by a request sent at `since` (main thread)."""
        if self.renews and math.isfinite(delivery.lease_until):
            delivery.lease_until = since + self.lease_seconds

    def lapsing(self, run: Run, now: float) -> bool:
        """Whether `run`'s lease is too close to its end to start it."""
        return self.on and run.delivery.lease_until - self.margin <= now

    def _due(self, run: Run) -> None:
        """On the clock's thread: set again if renewed, else stop the runner."""
        assert run.runner is not None
        now = time.monotonic()
        if not self.lapsing(run, now):  # renewed since: check again before the new end
            with self.pool.live(run.runner, run) as live:
                if live:
                    self.clock.at(run.delivery.lease_until - self.margin,
                                  lambda: self._due(run))
            return
        with self.pool.live(run.runner, run) as live:
            if not live or run.interrupted or run.hard_timed_out or run.cancelled:
                return
            run.interrupted = run.fenced = True
            run.runner.signal(signal.SIGKILL)
        unrenewed = now - (run.delivery.lease_until - self.lease_seconds)
        log.error("%s: self-fenced: its lease was not renewed for %.1f s (the broker is "
                  "unreachable) and lapses within %.1f s: its runner (pid %d) was killed so "
                  "that no other worker's run of it overlaps this one; the message is "
                  "delivered again", run.log_label, unrenewed,
                  run.delivery.lease_until - now, run.runner.pid)
