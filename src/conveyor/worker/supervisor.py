"""The supervisor: the `conveyor worker` process.

It holds at most `concurrency` deliveries (so a long task never keeps short ones waiting in a
prefetch buffer; on RabbitMQ `--read-ahead` lets up to READ_AHEAD more wait in the
connection, and on Postgres a worker running short tasks claims that many more at once,
handed out only when a slot frees), hands each to a runner forked ahead of need,
watches the runner (reports, exit status, cgroup OOM counter, time limits), and settles the
message only after the outcome event is published: ack, retry later with backoff, requeue,
or dead-letter.

Its main thread blocks on the broker; the pool's watcher thread has it woken
(`broker.wakeup`, on a thread of its own: worker/waker.py) when a runner finishes, and
signal handlers do the same for SIGTERM/SIGINT. Everything
that touches the broker happens on the main thread. Nothing the worker promises by itself
waits for it: time limits, the drain deadline and a cold stop are timers on the worker's
clock (worker/clock.py), and a run's duration ends when its runner reports or exits, so a
broker call that hangs through an outage delays settles, never a kill.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

from conveyor.broker import Consumer, Delivery
from conveyor.control.watch import CancelWatch
from conveyor.errors import BrokerConnectionError, ConveyorError, LeaseLost
from conveyor.events import ENDED_WELL
from conveyor.message import Codec, Message, skip_codes
from conveyor.signals import SignalThread
from conveyor.worker.cancelling import Canceller
from conveyor.worker.cgroups import MemoryCaps
from conveyor.worker.clock import Clock
from conveyor.worker.config import WorkerConfig
from conveyor.worker.fencing import SelfFence
from conveyor.worker.flow import Gate
from conveyor.worker.followups import Publisher
from conveyor.worker.frames import FrameTooLarge
from conveyor.worker.intake import Intake
from conveyor.worker.observers import Observer, Observers
from conveyor.worker.outage import HeldSettles
from conveyor.worker.outcome import (
    Action,
    Facts,
    Outcome,
    classify,
    decide,
    exec_report,
    outside_dag,
)
from conveyor.worker.pool import Runner, RunnerPool
from conveyor.worker.run import Run, slots
from conveyor.worker.terms import limits_for, wire_of
from conveyor.worker.waker import Waker

log = logging.getLogger("conveyor.worker")


#: How a supervisor gets its runner pool: called once, with what the pool calls when a
#: runner is ready or a run finished (from its watcher thread). worker/cli.py builds the
#: real one; a unit test hands in a fake.
PoolFactory = Callable[[Callable[[], None]], RunnerPool]


class Supervisor(Intake):
    def __init__(self, config: WorkerConfig, broker: Consumer, codec: Codec, *,
                 pool: PoolFactory, caps: MemoryCaps, followups: Publisher,
                 observers: Sequence[Observer] = (), gate: Gate | None = None,
                 cancels: CancelWatch | None = None) -> None:
        """`pool` builds the runner pool (worker/pool.py), whose lanes `caps` caps (one
        memory cgroup per lane: worker/cgroups); the supervisor closes both when it stops.
        `followups` publishes what tasks enqueue (worker/followups.py), on a broker
        connection of its own: this one is the main thread's alone. `observers` follow
        each delivery's life, hook by hook in this order (tracing, results, metrics,
        lifecycle events: worker/observers.py); `gate` admits limited messages and
        observes the runs after them, last (worker/flow.py; None: no limiter here).
        `cancels`: what was cancelled (conveyor/control), started here on its own thread
        (`CancelWatch.start_behind`): its first read (100-200 ms at load 6-21 on RabbitMQ)
        overlaps the pool's start-up, and `run` waits for it before the first delivery
        (worker/cancelling.py)."""
        self.config = config
        self.followups = followups
        self.broker = broker
        self.codec = codec
        self.caps = caps
        self.gate = gate
        if gate is not None:
            gate.tell = self._tell  # its parked and unparked events
        self.observers = Observers([*observers, *([gate] if gate is not None else [])])
        self.pending: deque[Run] = deque()
        #: deliveries a park batch claimed and left alone (worker/flow.py), handed to
        #: `_accept` before the broker's next; never more than the slots free at the time
        self.spare: deque[Delivery] = deque()
        self.held = HeldSettles(config.exit_after_outage)  # settles the broker could not take
        self.running: set[Run] = set()
        #: queue -> (succeeded, failed) tasks since start, for the heartbeat: replaced, never
        #: mutated, so the registry's thread can copy it while the main thread counts
        self.finished: dict[str, tuple[int, int]] = {}
        self.draining_since: float | None = None
        self.cold = False
        self._next_heartbeat = time.monotonic() + config.heartbeat_interval
        self._pool_changed = threading.Event()
        self._in_broker_wait = False
        self._waker = Waker(self._wake_broker)
        self._signals: SignalThread | None = None  # acts on SIGTERM/SIGINT: conveyor.signals
        self._consuming = False
        if cancels is not None:
            cancels.start_behind()  # read while the pool starts; `run` waits for it
        try:
            self.pool = pool(self._on_pool_change)
        except BaseException:
            if cancels is not None:
                cancels.close()
            raise
        self.clock = Clock(self._on_pool_change)  # after the pool, which may fail to start
        self.fence = SelfFence(self.clock, self.pool, broker.fence_seconds,
                               renews=broker.leases, renew_every=config.heartbeat_interval)
        self.cancels = Canceller(cancels, self.pool, self.clock, config.cancel_grace,
                                 lambda: list(self.running))
        broker.hold_connections_with(self.pool.hold)  # no redelivery while a runner lives

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Consume until told to stop (or, with --burst, until the queues are empty)."""
        self._signals = SignalThread({signal.SIGTERM: self._on_stop_signal,
                                      signal.SIGINT: self._on_stop_signal})
        self.cancels.ready()  # before the first delivery: it must know what to refuse
        log.info("worker %s consuming %s with %d slots; memory caps: %s; runner teardown: %s",
                 self.config.hostname, ",".join(self.config.queues), self.config.concurrency,
                 self.caps.describe(), self.pool.teardown)
        steps = self.broker.consume(list(self.config.queues), prefetch=self.config.concurrency,
                                    timeout=min(1.0, self.config.heartbeat_interval),
                                    ahead=self.config.read_ahead)
        try:
            while True:
                self.held.retry()
                delivery = self._next(steps)
                failure = self.pool.failure or self.clock.failure
                if failure:
                    raise ConveyorError(f"worker stopping: {failure}")
                if delivery is not None:
                    self._accept(delivery)
                self._settle_finished()
                self._start_pending()
                self._check_timers(time.monotonic())
                if self._done(delivery):
                    return 0
        finally:
            self._stop()

    def _next(self, steps: Generator[Delivery | None, float | None, None]) -> Delivery | None:
        """Block where the next thing will come from: the broker if a slot is free, else the
        runner pool. Waking the broker costs a round trip on some transports, so a full
        worker never waits there."""
        if self.draining_since is not None:
            self._give_back_spare("the worker is draining")
        if len(self.running) + len(self.pending) >= self.config.concurrency \
                or self.draining_since is not None:
            self._pool_changed.wait(timeout=min(1.0, self.config.heartbeat_interval,
                                                self._send_owed()))
            self._pool_changed.clear()
            return None
        if self.spare:
            return self.spare.popleft()
        self._in_broker_wait = True
        try:
            if not self._consuming:  # a generator's first step cannot take a value
                self._consuming = True
                return next(steps)
            return steps.send(0.0 if self._pool_changed.is_set() else None)
        finally:
            self._in_broker_wait = False
            self._pool_changed.clear()

    def _send_owed(self) -> float:
        """While the loop does not step the broker: send the acks it deferred to its next
        claim once they are due (Broker.owed_for), and give back what it claimed ahead if
        draining; seconds until the next are due. A pool change wakes it, as in a broker
        wait, should the broker be away."""
        due = self.broker.owed_for
        draining = self.draining_since is not None and self.broker.claimed_ahead > 0
        if (due is None or due > 0) and not draining:
            return float("inf") if due is None else due
        self._in_broker_wait = True
        try:
            self.broker.send_owed()
            if draining:
                self.broker.give_back_claimed()
        finally:
            self._in_broker_wait = False
        due = self.broker.owed_for
        return float("inf") if due is None else due

    def _on_pool_change(self) -> None:
        """Called by the pool's watcher thread when a runner is ready or a run finished (and
        by the clock and the signal thread): the broker is woken on the waker's thread, as
        a wake-up may wait on an unreachable broker (worker/waker.py)."""
        self._pool_changed.set()
        if self._in_broker_wait:
            self._waker.request()

    def _wake_broker(self) -> None:
        if self._in_broker_wait:
            self.broker.wakeup()

    def _done(self, last: Delivery | None) -> bool:
        if self.running:
            return False
        if self.draining_since is not None:
            return True  # what is pending or spare never started: `_stop` gives it back
        if self.pending or self.spare:
            return False
        if not self.config.burst or last is not None:
            return False
        # in flight elsewhere counts: a crashed worker's lease may expire into our hands
        return self.broker.is_empty(self.config.queues) \
            and (self.gate is None or self.gate.waiting() == 0)

    def _stop(self) -> None:
        self._give_back_spare("the worker stopped")
        for run in list(self.pending):
            self._settle(run, Action("requeue", reason="worker stopped"), None)
            self._release(run)
        if self.held:
            log.warning("stopping with %d settle(s) the broker never took: those messages are "
                        "delivered again", len(self.held))
        self.clock.close()
        self.cancels.close()
        self.pool.close()
        self._waker.close()
        self.followups.close()
        self.caps.close()
        if self._signals is not None:
            self._signals.close()
        self.observers.close()
        self.broker.close()
        log.info("worker %s stopped", self.config.hostname)

    # -- starting runs --------------------------------------------------------------------

    def _start_pending(self) -> None:
        while self.pending and self.draining_since is None:
            if self.pending[0].message.expired(time.time()):   # waited past it for a runner
                run = self.pending.popleft()
                self._refuse_expired(run.delivery, run.message)
                self._release(run)
                continue
            if self.pending[0].message in self.cancels:   # cancelled while it waited
                run = self.pending.popleft()
                self._refuse_cancelled(run.delivery, run.message)
                self._release(run)
                continue
            if self.fence.lapsing(self.pending[0], time.monotonic()):
                run = self.pending.popleft()
                log.warning("%s: not started: its lease could not be renewed and lapses now "
                            "(the broker was unreachable); it is delivered again", run.log_label)
                self._settle(run, Action("requeue", reason="its lease lapsed unstarted"), None)
                self._release(run)
                continue
            runner = self.pool.take()
            if runner is None:
                return
            self._start(self.pending.popleft(), runner)

    def _start(self, run: Run, runner: Runner) -> None:
        m, c = run.message, self.config
        memory, hard, soft = limits_for(m, c)
        run.runner, run.started = runner, time.monotonic()
        run.soft_at = run.started + soft if soft else math.inf
        run.hard_at = run.started + (hard or (soft + c.soft_grace if soft else math.inf))
        wire = wire_of(m)
        self.observers.starting(run, wire["headers"])
        try:
            self.pool.start(runner, run, {"message": wire}, memory)
        except FrameTooLarge as exc:  # no runner can take it on this host: said, not looped
            self.pool.release(runner)
            self._reject(run.delivery, f"too large to hand to a runner: {exc}", m)
            self._release(run)
            return
        except OSError as exc:  # the runner died while idle: another one will take the task
            log.warning("runner %d could not take %s (%s); trying another", runner.pid,
                        run.log_label, exc)
            self.pool.abandon(runner)
            self.pending.appendleft(run)
            return
        self.running.add(run)
        self.cancels.started(run)
        if soft:
            run.timers.append(self.clock.at(run.soft_at, lambda: self._soft_limit(run)))
        if run.hard_at < math.inf:
            run.timers.append(self.clock.at(run.hard_at, lambda: self._hard_limit(run)))
        self.fence.watch(run)
        self.observers.started(run)
        self._tell("started", m, run.delivery.queue, pid=runner.pid)
        self._gauges()

    def runners(self) -> dict[str, Any]:
        """For the worker's heartbeat (from any thread): what each runner slot holds now
        (`run.slots`), and per queue the tasks that succeeded and failed since start."""
        finished = {queue: list(counts) for queue, counts in dict(self.finished).items()}
        return {"limiter": self.caps.kind, "teardown": self.pool.teardown,
                "slots": slots(self.pool.usage(), time.monotonic()), "finished": finished}

    # -- finishing runs -------------------------------------------------------------------

    def _settle_finished(self) -> None:
        while not self.pool.finished.empty():
            runner = self.pool.finished.get_nowait()
            run = runner.task
            assert isinstance(run, Run)  # only the supervisor hands runners tasks
            self.running.discard(run)
            for timer in run.timers:
                self.clock.cancel(timer)
            outcome = self.observers.finished(run, self._outcome(run, runner))
            report_only = run.message.headers.get("settle") == "report"
            if outcome.kind == "deferred" and not report_only:   # no scheduler to resume it
                outcome = outside_dag(outcome)
                action = Action("dead_letter", reason=outcome.reason)
            else:
                action = self._action(run, outcome, runner, report_only)
            self.observers.decided(run, runner, outcome, action)
            self._report(run, outcome, action, runner.ended - run.started)
            action = self.observers.settling(run, outcome, action)
            self._settle(run, action, outcome)
            self._release(run)
            self.pool.release(runner)
            self._gauges()

    def _outcome(self, run: Run, runner: Runner) -> Outcome:
        if runner.exec_mode and runner.report is None and runner.status is not None:
            runner.report = exec_report(runner.status, skip_codes(run.message.headers))
        status = runner.status if runner.exited else 0
        oom = self.pool.oom_killed(runner)
        return classify(Facts(runner.report, status, oom, run.hard_timed_out, run.interrupted,
                              last_words=runner.last_line.strip()[-500:],
                              cancelled=run.cancelled, fenced=run.fenced))

    def _action(self, run: Run, outcome: Outcome, runner: Runner, report_only: bool) -> Action:
        if (runner.report or {}).get("outcome") == "unknown_task":
            return Action("dead_letter", reason=runner.report["reason"])  # type: ignore[index]
        return decide(outcome, run.message.attempt, run.budget, report_only)

    def _report(self, run: Run, outcome: Outcome, action: Action, duration: float) -> None:
        """Publish the outcome before settling the message: nothing is acked unreported."""
        m, queue = run.message, run.delivery.queue
        retry_in = action.delay if action.verb == "retry" else 0.0
        kind = {"killed": "failed", "lost": "failed", "retry_requested": "failed"}.get(
            outcome.kind, outcome.kind)
        if kind not in ("interrupted", "cancelled", "deferred"):   # it goes on later
            done, failed = self.finished.get(queue, (0, 0))
            ok = kind in ENDED_WELL
            self.finished[queue] = (done + ok, failed + (not ok))
        where: dict[str, Any] = {"pid": run.runner.pid, "log": tuple(run.runner.tail)} \
            if run.runner is not None else {}
        started_at = time.time() - (time.monotonic() - run.started)
        if outcome.asset_extra:   # a DAG task's extras for its asset events
            where["asset_extra"] = outcome.asset_extra
        self._tell(kind, m, queue, duration, result=outcome.result, error=dict(outcome.error),
                   reason=outcome.reason, retry_in=retry_in, started_at=started_at, **where)
        if action.verb == "retry":
            self._tell("retried", m, queue, reason=action.reason, retry_in=retry_in)
        elif action.verb == "dead_letter":
            self._tell("dead_lettered", m, queue, reason=action.reason)
        level = logging.INFO if outcome.kind in (*ENDED_WELL, "deferred") else logging.WARNING
        if log.isEnabledFor(level):  # its label is formatted eagerly: not for nothing
            log.log(level, "%s %s in %.3fs -> %s %s", run.log_label, outcome.kind, duration,
                    action.verb, action.reason)

    def _settle(self, run: Run, action: Action, outcome: Outcome | None) -> None:
        """Settle now, or hold it while the broker is unreachable (see worker/outage.py)."""
        self.held.settle(run.log_label, lambda: self._send_settle(run, action))
        if action.verb in ("ack", "dead_letter"):  # terminal: not a retry, nor a requeue
            self._unhold(run.message)
        self.observers.settled(run, action)

    def _send_settle(self, run: Run, action: Action) -> None:
        d = run.delivery
        try:
            if action.verb == "ack":
                self.broker.ack_soon(d)  # answered with the next claim: one round trip
            elif action.verb == "retry":
                body = self.codec.encode(run.message.next_attempt())
                self.broker.retry_later(d, action.delay, body)
            elif action.verb == "requeue":
                self._tell("interrupted", run.message, d.queue, reason=action.reason)
                self.broker.retry_later(d, 0.0, self._queued_again(run.message))
            else:
                self.broker.dead_letter(d, action.reason)
        except LeaseLost as exc:
            log.warning("%s: %s", run.log_label, exc)

    def _queued_again(self, message: Message) -> bytes | None:
        """The body to requeue `message` with: a fresh deadline to start when it has one
        (the scheduler restarts its queued timeout on `interrupted`), else the same body."""
        return self.codec.encode(message.queued_again(time.time())) if message.expires \
            else None

    def _release(self, run: Run) -> None:
        self.observers.released(run)

    # -- time: limits, heartbeats, drain ----------------------------------------------------

    def _check_timers(self, now: float) -> None:
        """The loop's own timers: heartbeats (broker calls) and the observers' tick (the
        limiter's sweep). The drain deadline is the clock's; checked here too for a run
        started as it passed."""
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_interval
            self._heartbeat()
        self.observers.tick()
        if self.draining_since is not None and (
                self.cold or now - self.draining_since >= self.config.drain_timeout):
            self._interrupt_all()

    def _hard_limit(self, run: Run) -> None:
        """On the clock's thread: SIGKILL the runner (what it forked is killed when its
        lane is released), unless its run is over or being stopped already."""
        assert run.runner is not None
        with self.pool.live(run.runner, run) as live:
            if live and not run.interrupted and not run.hard_timed_out:
                run.hard_timed_out = True
                run.runner.signal(signal.SIGKILL)

    def _soft_limit(self, run: Run) -> None:
        """On the clock's thread: SIGUSR1 raises SoftTimeLimitExceeded in the task."""
        assert run.runner is not None
        with self.pool.live(run.runner, run) as live:
            if live:
                run.runner.signal(signal.SIGUSR1)

    def _heartbeat(self) -> None:
        self.observers.heartbeat([*self.running, *self.pending])  # the limits' tokens
        try:
            self.broker.renew_claimed()  # read ahead (Postgres): not started yet, still ours
        except BrokerConnectionError as exc:
            log.warning("heartbeat skipped: %s", exc)
            return
        for delivery in list(self.spare):
            since = time.monotonic()
            try:
                self.broker.extend_lease(delivery)
            except LeaseLost:
                self.spare.remove(delivery)  # someone else's now
            except BrokerConnectionError:
                break
            else:
                self.fence.renewed(delivery, since)
        for run in [*self.running, *self.pending]:
            since = time.monotonic()
            try:
                self.broker.extend_lease(run.delivery)
                self.fence.renewed(run.delivery, since)
            except LeaseLost as exc:
                log.error("%s: %s", run.log_label, exc)
            except BrokerConnectionError as exc:  # settles will wait for it; leases may lapse
                log.warning("heartbeat skipped: %s", exc)
                return
            if run in self.running:
                self._tell("heartbeat", run.message, run.delivery.queue)

    def _interrupt_all(self) -> None:
        """Kill every run (they are requeued); on the clock's thread, or the loop's."""
        why = ("cold stop: a second stop signal came while draining" if self.cold else
               f"the drain timeout ({self.config.drain_timeout:g} s) passed")
        for run in list(self.running):
            assert run.runner is not None
            with self.pool.live(run.runner, run) as live:
                if not live or run.interrupted:
                    continue
                run.interrupted = True
                run.runner.signal(signal.SIGKILL)
            log.warning("%s killed and requeued: %s", run.log_label, why)

    def _on_stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            log.warning("%s: draining: no new tasks; %d running get up to %.0fs to finish "
                        "(send it again to stop at once)", name, len(self.running),
                        self.config.drain_timeout)
            self.clock.at(self.draining_since + self.config.drain_timeout,
                          self._interrupt_all)
            self.broker.pause(wake=False)  # woken by the waker: this thread must not wait
            self._on_pool_change()
            return
        self.cold = True
        self.clock.at(time.monotonic(), self._interrupt_all)
        log.warning("%s again: cold shutdown: killing %d running tasks and requeueing them",
                    name, len(self.running))
        self.broker.stop_retrying(wake=False)  # an unreachable broker is not waited for
        self._on_pool_change()

    # -- events -----------------------------------------------------------------------------

    def _gauges(self) -> None:
        self.observers.load(len(self.running) + len(self.pending),
                            self.config.concurrency - len(self.running))

