"""Consuming from RabbitMQ and settling what was consumed.

**First listed queue first.** One consumer per queue on one channel, each with `basic.qos`
prefetch equal to the consumer's `prefetch`; deliveries land in a buffer per queue and
`_claim` takes from the buffers in the listed order. Before it hands out a delivery from a
later-listed queue it drains the socket, then checks each earlier-listed queue with a passive
declare and takes a ready message from it with `basic.get`. So a single-queue consumer pays
nothing, and a multi-queue one pays one round trip per earlier queue only when it serves a
later one. A queue's priority bands (`bands`) are served the same way, highest first, but a
higher band is only asked while it may hold work RabbitMQ did not push to this consumer.
A later-listed queue's buffer may hold up to `prefetch` messages while earlier queues keep
the worker busy (RabbitMQ has no channel-wide prefetch on quorum queues).

**Batch claims.** `claim_more` (a worker parking a full key's backlog) streams a batch
through a second consumer on the consuming channel whose prefetch is the batch size, at most
the queue's ready count, and cancels it once that credit is used: a few round trips a batch
instead of a `basic.get` per message, and nothing rejected back (a quorum queue counts a
requeue toward `x-delivery-limit`). Its deliveries are held and settled like any other.

**Draining.** After `pause()` the consumer cancels its consumers at its next broker call
(a wait, an ack, a heartbeat) and hands back what it had buffered (nack, requeue; RabbitMQ
counts that as a delivery), so other workers start those messages during the drain.

**Consumer timeout.** RabbitMQ closes the channel of a delivery unacknowledged for longer than
the consumer timeout, and the message is redelivered. The per-queue `x-consumer-timeout`
argument (set here from `?consumer_timeout=`, seconds, default 3600) is honoured from RabbitMQ
3.12; 3.10 and 3.11 accept and ignore it and apply the broker-wide `consumer_timeout` of
rabbitmq.conf (30 minutes by default), so a WARNING names that limit when consuming from an
older server. On 3.12+ change the value with a `consumer-timeout` policy: a different argument
on an existing queue fails its declaration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from conveyor.broker.bands import priority_of
from conveyor.broker.base import Delivery
from conveyor.broker.rabbitmq.bands import bands_high_first
from conveyor.broker.rabbitmq.connection import CONNECTION_ERRORS
from conveyor.broker.rabbitmq.headers import (
    DEAD_AT_HEADER,
    DELIVERIES_HEADER,
    REASON_HEADER,
    clip_reason,
    delivery_count,
)
from conveyor.broker.rabbitmq.ledger import Receipt, Subscription
from conveyor.broker.rabbitmq.producer import RabbitMQProducer
from conveyor.errors import BrokerError, LeaseLost

LOG = logging.getLogger("conveyor.broker.rabbitmq")

#: The first RabbitMQ release that honours the per-queue x-consumer-timeout argument.
PER_QUEUE_TIMEOUT_SINCE = (3, 12)
#: How long a consumer with owed acks and free prefetch waits for more deliveries before it
#: sends the acks and blocks (acks are Raft commands on quorum queues: batches are cheaper).
ACK_DELAY = 0.005
#: The longest single block in pika's I/O loop: a wakeup() from a signal handler on the
#: consuming thread only sets a flag (pika's thread-safe wake-up takes locks the interrupted
#: thread may hold), so it is seen within this.
WAIT_SLICE = 0.5
#: How long a consumer this object settled (a basic.get, a cancelled consumer) may still be
#: counted by RabbitMQ, which applies an ack asynchronously.
VANISH_SECONDS = 1.0
#: A batch claim (`claim_more`) of this many or fewer uses basic.get, one round trip each;
#: more use a consumer of their own (`_stream`: about five round trips, whatever the size).
GET_AT_MOST = 4
#: How long a batch consumer waits for deliveries that other consumers may have taken, and
#: how long it reads between checks of the queue's ready count.
BATCH_WAIT = 0.2
BATCH_SLICE = 0.01
#: How long nothing must arrive before an empty queue ends a batch early (deliveries already
#: assigned to the batch consumer are no longer ready, though still on their way).
BATCH_STALL = 0.05
#: How long a consumer waits for a higher band's message RabbitMQ is pushing to it before it
#: takes it with basic.get instead (which would overtake the pushed one).
PUSH_WAIT = 0.02


def _noop() -> None:
    """A callback whose only job is to make `process_data_events` return."""


class RabbitMQConsumer(RabbitMQProducer):
    """Consuming in listed order, batch claims, draining, recovery; and settling."""

    # -- consuming -----------------------------------------------------------------------------

    def _start_consuming(self, queues: Sequence[str], prefetch: int) -> None:
        wanted = list(queues)
        prefetch += self._ahead  # the qos window: held plus read ahead (see Broker.consume)
        self._owner = threading.get_ident()
        self._warn_consumer_timeout()
        sub = self._sub
        if sub is not None and not sub.lost and (sub.queues, sub.prefetch) == (wanted, prefetch):
            return
        self._want = (wanted, prefetch)
        try:
            self._attempt(lambda: self._subscribe(wanted, prefetch))
        except CONNECTION_ERRORS as exc:
            self._lose_connection(f"subscribing to {wanted}", exc)  # _wait will retry

    def _warn_consumer_timeout(self) -> None:
        if self._warned_timeout or not self.server_version:
            return
        self._warned_timeout = True
        if self.server_version < PER_QUEUE_TIMEOUT_SINCE:
            LOG.warning(
                "RabbitMQ %s ignores the per-queue consumer timeout (x-consumer-timeout=%.0f s "
                "is honoured from 3.12): the broker-wide consumer_timeout of rabbitmq.conf "
                "applies (30 minutes unless set): a delivery held longer is taken back and "
                "redelivered. Raise consumer_timeout above your longest task time limit.",
                ".".join(map(str, self.server_version)), self.settings.consumer_timeout)

    def _subscribe(self, queues: list[str], prefetch: int) -> None:
        """Consume `queues` in listed order with `prefetch` each, re-using a live channel."""
        for queue in queues:
            self._ensure_queue(queue)
        sub = self._sub
        if sub is None or sub.lost or not sub.channel.is_open:
            sub = self._new_subscription()
        else:
            self._unsubscribe(sub)
        sub.channel.basic_qos(prefetch_count=prefetch)
        sub.queues, sub.prefetch, sub.cancelled = list(queues), prefetch, False
        sub.ahead = self._ahead
        for queue in queues:
            for name in bands_high_first(queue):
                sub.buffers.setdefault(name, deque())
                sub.tags[name] = sub.channel.basic_consume(name, self._receiver(sub, queue,
                                                                                name))

    def _new_subscription(self) -> Subscription:
        self._epoch += 1
        channel = self._connection().channel()
        sub = Subscription(channel=channel, epoch=self._epoch)
        channel.add_on_cancel_callback(lambda frame: setattr(sub, "cancelled", True))
        self._sub = sub
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        """Cancel the consumers; buffered deliveries nobody took go back (nack, requeue).

        Before each cancel, what arrived meanwhile is buffered (`_pump`): pika rejects a
        cancelled consumer's undispatched deliveries itself, one at a time, and RabbitMQ can
        push a rejected one straight back to a consumer not cancelled yet, where the
        cancel rejects it again: each costs a delivery toward x-delivery-limit."""
        self._flush(sub)
        for tag in sub.tags.values():
            self._pump()
            sub.channel.basic_cancel(tag)
        sub.tags.clear()
        for buffer in sub.buffers.values():
            while buffer:
                tag = buffer.popleft().receipt.tag
                sub.channel.basic_nack(tag, requeue=True)
                sub.ledger.drop(tag)
        sub.buffers.clear()

    def _receiver(self, sub: Subscription, queue: str,
                  name: str) -> Callable[[BlockingChannel, Basic.Deliver, BasicProperties,
                                          bytes], None]:
        """Buffer what the consumer of `name` (a band of `queue`) is pushed."""
        def receive(channel: BlockingChannel, method: Basic.Deliver, props: BasicProperties,
                    body: bytes) -> None:
            delivery = self._delivery(sub, queue, name, method.consumer_tag, method, props,
                                      body, pushed=True)
            sub.buffers.setdefault(name, deque()).append(delivery)
        return receive

    def _delivery(self, sub: Subscription, queue: str, name: str, consumer: str,
                  method: Basic.Deliver | Basic.GetOk, props: BasicProperties, body: bytes,
                  pushed: bool) -> Delivery:
        """A delivery of `queue` that came from its band queue `name` (the ledger counts it
        there: RabbitMQ counts consumers and unacked messages per band queue)."""
        tag = method.delivery_tag
        sub.ledger.add(tag, name, consumer, pushed)
        if name != queue:
            sub.busy.add(name)
        receipt = Receipt(epoch=sub.epoch, tag=tag, consumer=consumer,
                          message_id=props.message_id)
        headers = props.headers or {}
        return Delivery(queue=queue, body=body, delivery_count=delivery_count(headers),
                        receipt=receipt, priority=priority_of(headers),
                        lease_until=self._lease_until())

    def _live(self) -> Subscription | None:
        """The subscription if it can still deliver; notices a channel RabbitMQ closed."""
        sub = self._sub
        if sub is None or sub.lost:
            return None
        if self._conn is None or not self._conn.is_open or not sub.channel.is_open:
            reason = getattr(sub.channel, "_closing_reason", None)
            LOG.warning("consuming from %s failed: RabbitMQ closed the consuming channel or "
                        "connection (%r; a delivery held past the consumer timeout does "
                        "this); its deliveries will be redelivered; re-subscribing",
                        sub.queues, reason)
            sub.lost = True
            return None
        if sub.cancelled:
            LOG.warning("RabbitMQ cancelled the consumer of %s (queue deleted?); "
                        "re-subscribing", sub.queues)
            self._subscribe(sub.queues, sub.prefetch)
        return sub

    def _claim(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Hand out one buffered delivery, first listed queue first; a consumer reading
        ahead first sends the acks its settles owe (see `_finish`)."""
        try:
            sub = self._live()
            if sub is None:
                return []
            if sub.ahead:
                self._flush(sub)
            delivery = self._take(sub, queues)
            if delivery is None:
                self._pump()
                delivery = self._take(sub, queues)
        except CONNECTION_ERRORS as exc:
            self._lose_connection("claiming a delivery", exc)
            return []
        return [] if delivery is None else [delivery]

    def claim_more(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Take up to `limit` ready deliveries now, first listed queue first, in a few round
        trips (see `_stream`); a few are taken with one basic.get each, which is cheaper."""
        got: list[Delivery] = []
        try:
            sub = self._live()
            if sub is None or self._paused:
                return []
            for queue in queues:
                for name in bands_high_first(queue):
                    if len(got) >= limit:
                        break
                    if name != queue and not self._may_hold(sub, name):
                        continue  # RabbitMQ pushed us what it had there
                    counts = self._passive(name)
                    ready = min(limit - len(got), counts[0] if counts is not None else 0)
                    if ready > GET_AT_MOST:
                        got += self._stream(sub, queue, name, ready)
                    got += self._get(sub, queue, name, limit - len(got))
        except CONNECTION_ERRORS as exc:
            self._lose_connection("claiming a batch of deliveries", exc)
        self._held(len(got))  # from a lost channel they raise LeaseLost when settled
        return got

    def _get(self, sub: Subscription, queue: str, name: str, limit: int) -> list[Delivery]:
        """basic.get from band queue `name` of `queue` until `limit` or it is empty, one
        round trip each."""
        got: list[Delivery] = []
        while len(got) < limit:
            method, props, body = sub.channel.basic_get(name)
            if method is None or props is None or body is None:
                break
            got.append(self._delivery(sub, queue, name, f"get {method.delivery_tag}", method,
                                      props, body, pushed=False))
        return got

    def _stream(self, sub: Subscription, queue: str, name: str,
                credit: int) -> list[Delivery]:
        """Up to `credit` deliveries from a consumer of their own, cancelled afterwards.

        RabbitMQ pushes a consumer at most its prefetch, set (basic.qos) just before it
        subscribes, and a later qos does not change an existing consumer's: so a second
        consumer on this channel with prefetch `credit`, `credit` no more than the queue's
        ready count, streams the batch in one round trip instead of `credit`. It is
        cancelled once it has used up its credit, when nothing more can be on its way:
        pika rejects a delivery that arrives after the cancel (requeue, and a quorum queue
        counts that toward x-delivery-limit: measured on 3.10). Only if other consumers
        took part of the ready messages first does it stop early, after BATCH_WAIT or once
        nothing arrived for BATCH_STALL and the queue is empty; a publish landing in that
        round trip is then rejected so, like the deliveries a paused consumer hands back.
        What it got stays unacked to this channel and is settled like a basic.get's
        (RabbitMQ counts the cancelled consumer until they are acked, and so does the
        ledger). The channel's qos is left at `credit`: `_subscribe` sets it again before
        it consumes."""
        got: list[Delivery] = []

        def receive(channel: BlockingChannel, method: Basic.Deliver, props: BasicProperties,
                    body: bytes) -> None:
            got.append(self._delivery(sub, queue, name, method.consumer_tag, method, props,
                                      body, pushed=True))

        sub.channel.basic_qos(prefetch_count=credit)
        tag = sub.channel.basic_consume(name, receive)
        try:
            deadline = time.monotonic() + BATCH_WAIT
            last = (0, time.monotonic())  # deliveries so far, and when the count last grew
            while len(got) < credit and time.monotonic() < deadline:
                self._io(BATCH_SLICE)
                now = time.monotonic()
                if len(got) > last[0]:
                    last = (len(got), now)
                elif now - last[1] >= BATCH_STALL and self._taken_by_others(name, got):
                    break
        finally:
            if sub.channel.is_open:
                sub.channel.basic_cancel(tag)
        return got

    def _taken_by_others(self, queue: str, got: list[Delivery]) -> bool:
        """Whether the queue has nothing ready and nothing more reached `got` meanwhile (a
        delivery read during the passive declare waits in pika; one more read hands it
        over, where a cancel would reject it): then nothing more is coming."""
        before = len(got)
        ready = (self._passive(queue) or (0, 0))[0]
        self._pump()
        return ready == 0 and len(got) == before

    def _take(self, sub: Subscription, queues: Sequence[str]) -> Delivery | None:
        """The next delivery: first listed queue first, and within a queue its highest band
        first (see `bands`)."""
        for index, queue in enumerate(queues):
            names = bands_high_first(queue)
            for rank, name in enumerate(names):
                buffer = sub.buffers.get(name)
                if buffer:
                    earlier = self._take_earlier(sub, queues[:index], queue, names[:rank])
                    return earlier or buffer.popleft()
        return None

    def _take_earlier(self, sub: Subscription, earlier: Sequence[str], queue: str,
                      higher: Sequence[str]) -> Delivery | None:
        """Before serving a later-listed queue or a lower band, take work an earlier-listed
        queue or a higher band of `queue` has. An earlier queue is asked (a passive declare)
        as before bands; a band above 0 only while it may hold work this consumer was not
        sent (`_may_hold`): so a queue whose messages all have the default priority pays
        nothing for its bands."""
        pairs = [(q, name) for q in earlier for name in bands_high_first(q)]
        pairs += [(queue, name) for name in higher]
        ask = [(q, name) for q, name in pairs if name == q or self._may_hold(sub, name)]
        if not ask:
            return None
        self._pump()
        found = _first_buffered(sub, pairs)
        for q, name in ask:
            if found is not None:
                return found
            counts = self._passive(name)
            # A delivery pushed before the answer (after an ack freed credit) is read now.
            self._pump()
            found = _first_buffered(sub, pairs)
            if found is not None:
                continue
            if counts is None or counts[0] == 0:
                sub.busy.discard(name)
                continue
            if not self._starved(sub, name):
                found = self._await_push(sub, pairs)  # a get would overtake it: FIFO
                if found is not None:
                    continue
            method, props, body = sub.channel.basic_get(name)
            if method is not None and props is not None and body is not None:
                return self._delivery(sub, q, name, f"get {method.delivery_tag}", method,
                                      props, body, pushed=False)
            # Counted but not got: RabbitMQ pushed it to our consumer meanwhile; it arrives
            # before the get's empty answer on this channel, so one more read finds it.
            self._pump()
            found = _first_buffered(sub, pairs)
        return found

    def _await_push(self, sub: Subscription,
                    pairs: Sequence[tuple[str, str]]) -> Delivery | None:
        """A ready message of a band whose consumer has credit is being pushed to us: wait
        up to PUSH_WAIT for it rather than overtake it with a get."""
        deadline = time.monotonic() + PUSH_WAIT
        found = None
        while found is None and time.monotonic() < deadline:
            self._io(BATCH_SLICE)
            found = _first_buffered(sub, pairs)
        return found

    def _starved(self, sub: Subscription, name: str) -> bool:
        """Whether the consumer of band queue `name` has used up its credit (every message
        its window allows is held, buffered or owes its ack): RabbitMQ pushes it nothing."""
        tag = sub.tags.get(name)
        return tag is None or sub.ledger.held_by(tag) >= sub.prefetch

    def _may_hold(self, sub: Subscription, name: str) -> bool:
        """Whether band queue `name` may hold a ready message RabbitMQ has not pushed to
        this consumer: it sent us one from there since a passive declare last found it
        empty (the next may be on its way after an ack), or its consumer has used up its
        credit (every message its window allows is held, buffered or owes its ack)."""
        return name in sub.busy or self._starved(sub, name)

    def _wait(self, queues: Sequence[str], timeout: float) -> None:
        """Block in pika's I/O loop until a delivery, a wake-up or `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            sub = self._live()
            if sub is None:
                if not self._paused:
                    self._recover(timeout)
                else:
                    self._interrupted.wait(timeout)
                return
            self._stop_if_paused(sub)
            if sub.ledger.owed and not self._settle_owed(sub, timeout):
                return
            if self._interrupted.is_set():  # a wakeup() the ack delay's I/O took: go back
                return
            self._io(max(0.0, min(deadline - time.monotonic(), WAIT_SLICE)))
        except CONNECTION_ERRORS as exc:
            self._lose_connection(f"waiting for deliveries from {list(queues)}", exc)

    def _settle_owed(self, sub: Subscription, timeout: float) -> bool:
        """Send owed acks before blocking; True if the caller should go on and block.

        Every ack is a Raft command on a quorum queue, so acks of a whole window are sent
        as one. If the window is full RabbitMQ sends nothing until they arrive: send them
        now. Otherwise deliveries may be on their way: give them ACK_DELAY to arrive (and
        return, so they are handed out) before paying for the ack.
        """
        if sub.credit_left:
            self._io(min(timeout, ACK_DELAY))
            if any(sub.buffers.values()):
                return False
        self._flush(sub)
        return True

    def _stop_if_paused(self, sub: Subscription) -> None:
        """A paused (draining) consumer cancels its consumers and hands back what it buffered,
        so other workers run those messages now instead of after the drain."""
        if self._paused and sub.tags:
            self._unsubscribe(sub)
            sub.queues = []  # a later consume() subscribes afresh

    def _recover(self, budget: float) -> None:
        """Reconnect and re-subscribe, within `budget` seconds or until `wakeup()`."""
        if self._want is None:  # closed, or never subscribed: nothing to restore
            self._interrupted.wait(budget)
            return
        if self._interrupted.is_set():
            return
        queues = self._want[0]
        if self._recovery.attempt(f"re-subscribing to {queues}", self._resubscribe,
                                  self._interrupted, budget):
            LOG.warning("reconnected to RabbitMQ at %s and re-subscribed to %s; deliveries held "
                        "from the lost connection raise LeaseLost and will be redelivered",
                        self.settings.where, queues)

    def _resubscribe(self) -> bool:
        """One attempt of `_recover` (True: it worked)."""
        assert self._want is not None
        queues, prefetch = self._want
        self._attempt(lambda: self._subscribe(queues, prefetch))
        return True

    def _interrupt_wait(self) -> None:
        """Wake pika's I/O loop from another thread. On the consuming thread itself (a signal
        handler) the interrupt flag, checked every WAIT_SLICE, is all that is safe."""
        conn = self._conn
        if conn is None or threading.get_ident() == self._owner:
            return
        try:
            conn.add_callback_threadsafe(_noop)
        except (pex.AMQPError, OSError, RuntimeError):
            pass  # closed or closing: the consume loop sees the interrupt flag anyway

    # -- settling ------------------------------------------------------------------------------

    def _owned(self, delivery: Delivery, what: str) -> Subscription:
        """The live subscription that holds `delivery`, or LeaseLost."""
        receipt = delivery.receipt
        if not isinstance(receipt, Receipt):
            raise BrokerError(f"{what}: this delivery did not come from this RabbitMQ broker")
        if receipt.done:
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r}: it was already "
                            "settled")
        sub = self._sub
        if sub is None or sub.lost or sub.epoch != receipt.epoch or not sub.channel.is_open:
            self._release(receipt)
            raise LeaseLost(f"{what} of a message of queue {delivery.queue!r}: the connection "
                            "or channel it came on was lost, so RabbitMQ will redeliver it; "
                            "its outcome was not recorded")
        return sub

    def _release(self, receipt: Receipt) -> None:
        receipt.done = True
        self._settled()

    def _finish(self, sub: Subscription, delivery: Delivery, flush: bool) -> None:
        """Settle a held delivery: owe its ack, and send owed acks when enough are due.

        A consumer reading ahead (a worker) sends them with its next claim, which follows
        its settles at once (a settle frees a slot): the runs a worker settles in one
        wake-up go as one multiple ack, one Raft command on a quorum queue instead of one
        each. It must not wait for `_wait`: it hands out what it read ahead without
        blocking there, and with its window full RabbitMQ pushes more only when acks
        arrive. A heartbeat (`extend_lease`), `depth`, `pause` and `close` send them too."""
        self._release(delivery.receipt)
        sub.ledger.settle(delivery.receipt.tag)
        if delivery.receipt.consumer not in sub.tags.values():
            self._vanishing_until = time.monotonic() + VANISH_SECONDS
        if flush or len(sub.ledger.owed) >= sub.prefetch or self._paused:
            try:
                self._flush(sub)
            except CONNECTION_ERRORS as exc:
                self._lose_connection("acknowledging deliveries", exc)
                raise LeaseLost(f"the ack of a message of queue {delivery.queue!r} did not "
                                "reach RabbitMQ (connection lost): it will be redelivered"
                                ) from exc
            try:
                self._stop_if_paused(sub)
            except CONNECTION_ERRORS as exc:
                self._lose_connection("handing back buffered deliveries", exc)

    def _flush(self, sub: Subscription) -> None:
        if sub.ledger.owed and sub.channel.is_open:
            sub.ledger.flush(lambda tag, multiple: sub.channel.basic_ack(tag, multiple=multiple))

    def ack(self, delivery: Delivery) -> None:
        sub = self._owned(delivery, "ack")
        self._finish(sub, delivery, flush=False)

    def retry_later(self, delivery: Delivery, delay: float = 0.0,
                    body: bytes | None = None) -> None:
        """Publish a copy that carries the delivery count (via the ladder), then ack."""
        sub = self._owned(delivery, "retry_later")
        self._republish(delivery, delivery.body if body is None else body, delay,
                        {DELIVERIES_HEADER: delivery.delivery_count})
        self._finish(sub, delivery, flush=True)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Publish to `<queue>.dead` with reason, time and count in headers, then ack."""
        sub = self._owned(delivery, "dead_letter")
        headers = {REASON_HEADER: clip_reason(reason), DEAD_AT_HEADER: f"{time.time():.6f}",
                   DELIVERIES_HEADER: delivery.delivery_count}
        self._republish(delivery, delivery.body, 0.0, headers, dead=True)
        self._finish(sub, delivery, flush=True)

    def extend_lease(self, delivery: Delivery, seconds: float | None = None) -> None:
        """Deliveries are bound to the connection: keep it alive, check it still is, and
        stamp `lease_until` with what its liveness proves (liveness.py)."""
        sub = self._owned(delivery, "extend_lease")
        try:
            self._flush(sub)
            self._stop_if_paused(sub)
            self._pump()
        except CONNECTION_ERRORS as exc:
            self._lose_connection("extending a lease", exc)
        self._owned(delivery, "extend_lease")
        delivery.lease_until = self._lease_until()


def _first_buffered(sub: Subscription, pairs: Sequence[tuple[str, str]]) -> Delivery | None:
    """The first buffered delivery of the band queues in `pairs` ((queue, band queue))."""
    for _, name in pairs:
        buffer = sub.buffers.get(name)
        if buffer:
            return buffer.popleft()
    return None
