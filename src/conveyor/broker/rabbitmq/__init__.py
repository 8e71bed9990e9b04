"""RabbitMQ transport: durable quorum queues over pika's `BlockingConnection`.

Topology (declared on first use; every queue is durable and `x-queue-type=quorum`):

* `<queue>`: the work queue. `x-delivery-limit` (default 25, `?delivery_limit=`) sits above
  the worker's own cap of 20 deliveries as a backstop: a message returned more often than
  that is dead-lettered by RabbitMQ itself (`x-dead-letter-exchange` "" with routing key
  `<queue>.dead`, strategy at-least-once so the move cannot lose it).
* `<queue>.dead`: dead letters. `dead_letter()` publishes the message there with its reason,
  time and delivery count in headers, then acks the original. `dead_letters()` browses with
  `basic.get` and puts everything back with one `basic.nack(multiple, requeue)`: order and
  message ids (the dead letter ids) stay, nothing is copied. `requeue_dead()` publishes each
  back to `<queue>` without the count header (a fresh count) and acks the dead copy;
  `purge_dead()` acks (deletes) the chosen ones.
* `<queue>.pri.1`, `.pri.2`, `.pri.3`: the priority bands above `<queue>` (band 0), declared
  with it and with its arguments (delivery limit, dead letters into `<queue>.dead`).
* `<queue>.delay.<k>`: the delay ladder, below. The suffixes `.dead`, `.pri.<b>` and
  `.delay.<k>` are reserved.

Each of these is a quorum queue, a Raft group of its own: RabbitMQ 3.10 reserves about three
file handles per quorum queue, so give the server a generous open-files limit (its docs ask
for 65536; at 1024 a few hundred queues exhaust it and new connections hang).

Publishing waits for a publisher confirm (the message is in the quorum log) and is
`mandatory`, so a message can never vanish unrouted. Messages are persistent.

**Priorities**: quorum queues on RabbitMQ 3.10 have none, so a message goes to one of four
band queues by its priority (0 and below, 1-3, 4-6, 7 and above) and a consumer serves the
higher bands first; within a band, FIFO. What is guaranteed, and what it costs, is in `bands`.

Where each part's explanation lives, next to its code:

* `settings`: the `amqp://` URL and Conveyor's own query options.
* `ladder`: queue names and arguments, and delays without plugins (the delay ladder).
* `bands`: priorities as band queues, and the ordering they guarantee.
* `headers`: message properties, the delivery count, and reading dead letters back.
* `management`: the management-plugin client that in-flight counts need.
* `ledger`: per-delivery receipts and coalesced acks.
* `RabbitMQBroker` itself, one module per role, each class a subclass of the one before:
  `connection` (channels, declarations, connection loss), `producer` (publishing),
  `consumer` (consuming in listed order, batch claims, draining, the consumer timeout,
  settling), `inspector` (depth, `is_empty`, `watch`), `admin` (dead letters, purging), and
  `broker` (the class itself, and `close`).
"""

from conveyor.broker.rabbitmq.broker import RabbitMQBroker
from conveyor.broker.rabbitmq.headers import dead_letter_of, delivery_count
from conveyor.broker.rabbitmq.ladder import (
    DELAY_LEVELS,
    DELAY_UNIT_MS,
    MAX_DELAY,
    delay_key,
    delay_units,
    destination_token,
    level_pattern,
    set_levels,
)
from conveyor.broker.rabbitmq.ledger import AckLedger
from conveyor.broker.rabbitmq.management import ManagementAPI
from conveyor.broker.rabbitmq.settings import RabbitMQSettings, parse_url

__all__ = ["DELAY_LEVELS", "DELAY_UNIT_MS", "MAX_DELAY", "AckLedger", "ManagementAPI",
           "RabbitMQBroker", "RabbitMQSettings", "dead_letter_of", "delay_key", "delay_units",
           "delivery_count", "destination_token", "level_pattern", "parse_url", "set_levels"]
