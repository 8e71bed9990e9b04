"""kombu transport: Conveyor on any broker kombu reaches (`kombu+<transport>://…`).

`kombu+redis://host:6379/0`, `kombu+amqp://user:pass@host//`, `kombu+sqs://…`: everything
after `kombu+` is an ordinary kombu URL. This transport exists for brokers Conveyor has no
native transport for; on Redis and RabbitMQ prefer the native ones, which keep every
guarantee of `conveyor.broker.base`. It speaks only kombu's portable API (`Connection`,
`Producer`, `Consumer`, `Queue.get`, `queue_declare`/`queue_purge`), never a transport's
internals, so what kombu cannot express is named here instead of faked:

* **Priorities** in four bands (`conveyor.broker.bands`: 0 and below, 1-3, 4-6, 7 and
  above; FIFO within a band), as on native RabbitMQ, through kombu's own priority on the two
  transports that have one: on Redis a band is one of kombu's `priority_steps` sub-lists
  (band 3 is kombu priority 0, which kombu pops first, band 0 is 9: one BRPOP serves the
  highest band first), on AMQP the queue is declared with `x-max-priority` 3 and the band
  is the message priority. A queue made by an earlier version without that argument is
  refused (PRECONDITION_FAILED) until it is drained and deleted. On other kombu transports
  priorities are ignored (`supports_priority` is false there). A consumer hands out at most
  its prefetch of lower-band messages it already holds before a higher one.
* **Redelivery after a crash** is the transport's own. On AMQP it is connection-bound, as
  native: a killed consumer's messages come back at once. On kombu's virtual transports
  (Redis, SQS, SQLAlchemy, …) an unacknowledged message comes back only after the
  transport's *visibility timeout* (`?visibility_timeout=`, kombu's default 3600 s), and a
  delivery held longer than that is handed to another consumer although its worker is alive
  and heartbeating: `extend_lease` cannot renew it through kombu's API.
* **Delivery counts** after a crash: kombu says only whether a message was `redelivered`,
  not how often, so a message that crashed its consumer several times counts as one extra
  delivery. Counts carried through `retry_later` are exact (a header).
* **Delays are emulated**: a delayed message waits in one of the queue's delay levels
  `<queue>.delay.<k>` (level k holds delays of 2**k to 2**(k+1) s; level 0 under 2 s; the
  top level everything longer), stamped with its due time. Consumers look at the levels of
  the queues they consume, up to `LEVEL_SCAN` messages per look: due ones move to the queue,
  the others walk down a level as their remaining time shrinks, and the next look is timed
  by the earliest of them; a level that was empty is looked at again after max(1 s,
  2**(k-2) s), since another process may have published into it. So a delayed message is
  stored on the broker and never early (publisher and consumer clocks must agree: NTP), but
  may be late by up to max(1 s, a quarter of its delay), by up to its delay again when a
  level holds more than `LEVEL_SCAN` messages, and an idle consumer makes about four broker
  round trips a second per queue.
* **In-flight depth** counts only this broker object's own deliveries: AMQP and kombu have
  no portable unacknowledged count, so an autoscaler reading another process's depth sees 0.

Layout per queue: `<queue>`, `<queue>.dead` (dead letters: reason, time and count in
headers), `<queue>.delay.0…16`; every name gets the URL's `?prefix=` (on Redis it becomes
kombu's `global_keyprefix`, so kombu's own bookkeeping keys get it too). A consuming broker also
has a private wake queue (`conveyor.wake.<id>`) that `wakeup()` publishes to through a
second connection, so a blocked consume returns at once on every transport.

`?queue_expires=N` (seconds) declares every queue with `x-expires`: a queue nobody has used
for N seconds is deleted, messages and all. It is for tests and scratch namespaces only.

Connection loss: calls retry with backoff (`broker/reconnect.py`) for `?retry_seconds=`
(default 60) and then raise `BrokerConnectionError`; a consumer reconnects and re-subscribes
on its next step, for as long as the outage lasts. Deliveries held from a lost connection
raise `LeaseLost` when settled.
"""

from conveyor.broker.kombu.broker import KombuBroker
from conveyor.broker.kombu.messages import dead_letter_of, delivery_count
from conveyor.broker.kombu.settings import (
    KombuSettings,
    describe_limits,
    kombu_priority,
    level_floor,
    level_of,
    parse_url,
)

__all__ = ["KombuBroker", "KombuSettings", "dead_letter_of", "delivery_count",
           "describe_limits", "kombu_priority", "level_floor", "level_of", "parse_url"]
