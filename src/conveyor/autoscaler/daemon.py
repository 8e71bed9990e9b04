"""`conveyor autoscaler`: how many workers exist, decided from queue depth.

Every target is evaluated once per polling interval, and at once when its watch reports
new work while it is at zero. One evaluation: read the depth of its queues through the
broker seam (an error makes the load unknown: fallback replicas), read its replicas, ask
the pure rule (`policy.decide`) and, if the answer differs, scale. A target that cannot be
reached is logged and retried at the next poll. The loop itself only sleeps between
deadlines and pokes: an idle autoscaler costs next to nothing. With a state store, each
evaluation and replica change is recorded there for the dashboard (`journal.py`).

On SIGTERM it stops evaluating, stops its watches and drains its local workers; Kubernetes
Deployments keep their replicas (the next autoscaler takes over from there).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conveyor import broker as brokers
from conveyor import limits
from conveyor.autoscaler.blocked import Blocked
from conveyor.autoscaler.config import AutoscalerConfig, TargetConfig
from conveyor.autoscaler.journal import Evaluation, Journal
from conveyor.autoscaler.metrics import AutoscalerMetrics, MetricsServer
from conveyor.autoscaler.policy import Decision, Load, Memory, decide
from conveyor.autoscaler.probes import read_depths, total
from conveyor.autoscaler.targets import Target, TargetError
from conveyor.autoscaler.watch import ZeroWatch
from conveyor.broker import Inspector
from conveyor.config import Settings
from conveyor.errors import ConveyorError
from conveyor.limits import Limiter
from conveyor.locations import store_urls

log = logging.getLogger("conveyor.autoscaler")


@dataclass(eq=False)
class Scaled:
    """One target and what the daemon knows of it between evaluations."""

    config: TargetConfig
    target: Target
    memory: Memory
    due: float = 0.0
    watch: ZeroWatch | None = None
    depth_failing: bool = False
    error: str | None = None   # why the target could not be read or scaled, this evaluation


class Daemon:
    def __init__(self, targets: Sequence[tuple[TargetConfig, Target]], broker: Inspector,
                 metrics: AutoscalerMetrics | None = None,
                 open_broker: Callable[[], Inspector] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 journal: Journal | None = None,
                 open_limiter: Callable[[], Limiter] | None = None) -> None:
        self.broker = broker
        #: ready messages a full limit holds back do not count (see blocked.py)
        self.blocked = Blocked(open_limiter)
        self.journal = journal
        self.metrics = metrics or AutoscalerMetrics()
        self.clock = clock
        now = clock()
        self.scaled = [Scaled(config, target, Memory(started=now), due=now)
                       for config, target in targets]
        self._open_broker = open_broker
        self._poked: set[str] = set()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False
        #: Called on the loop's thread at every tick, before targets are evaluated (`up`
        #: looks at its DAG files there).
        self.on_tick: Callable[[float], None] = lambda now: None

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Evaluate targets until `stop()`; 0 when stopped, errors propagate."""
        self._start_watches()
        log.info("autoscaler: %d target(s): %s", len(self.scaled), ", ".join(
            f"{s.config.name} ({s.config.kind}, queues {','.join(s.config.queues)})"
            for s in self.scaled) or "none (serving depth only)")
        try:
            while not self._stopping:
                self.tick(self.clock())
                self._sleep()
        finally:
            self.close()
        return 0

    def tick(self, now: float) -> None:
        """Evaluate every target that is due or was poked."""
        self.on_tick(now)
        with self._lock:
            poked, self._poked = self._poked, set()
        self._check_watches()
        for s in self.scaled:
            if s.due <= now or s.config.name in poked:
                if s.config.name in poked and s.due > now:
                    self.metrics.wakeups.labels(s.config.name).inc()
                self.evaluate(s, now)

    def _sleep(self) -> None:
        until = min((s.due for s in self.scaled), default=self.clock() + 3600)
        self._wake.wait(max(0.0, until - self.clock()))
        self._wake.clear()

    def poke(self, name: str) -> None:
        """Evaluate target `name` now (from a watch thread)."""
        with self._lock:
            self._poked.add(name)
        self._wake.set()

    def stop(self) -> None:
        """Leave the loop after the current evaluation (signal handlers, other threads)."""
        self._stopping = True
        self._wake.set()

    # -- one evaluation -------------------------------------------------------------------

    def evaluate(self, s: Scaled, now: float) -> Decision | None:
        """Read, decide, scale; None if the target itself could not be read."""
        s.due = now + s.config.polling_interval
        s.error = None
        load = self._load(s)
        try:
            current = s.target.replicas()
        except TargetError as exc:
            self._target_failed(s, exc)
            self._record(s, None, None, load, "the target's replicas could not be read")
            return None
        decision = decide(s.config.rule, current, load, s.memory, now)
        s.memory = decision.memory
        replicas = self._apply(s, current, decision)
        self.metrics.replicas.labels(s.config.name).set(replicas)
        self.metrics.desired.labels(s.config.name).set(decision.replicas)
        self._record(s, replicas, decision.replicas, load, decision.reason)
        if s.watch is not None:
            s.watch.at_zero(replicas == 0)
        return decision

    def _record(self, s: Scaled, replicas: int | None, desired: int | None,
                load: Load | None, reason: str) -> None:
        """Tell the journal (if there is one) what this evaluation saw and chose."""
        if self.journal is None:
            return
        c = s.config
        self.journal.evaluated(Evaluation(
            target=c.name, kind=c.kind, queues=",".join(c.queues), replicas=replicas,
            desired=desired, min_replicas=c.rule.min_replicas, max_replicas=c.rule.max_replicas,
            ready=load.ready if load else None, in_flight=load.in_flight if load else None,
            reason=reason, error=s.error, polling_interval=c.polling_interval))

    def _load(self, s: Scaled) -> Load | None:
        try:
            depths = read_depths(self.broker, s.config.queues)
        except Exception as exc:  # any failure to read depth is a metric error
            self.metrics.errors.labels(s.config.name, "depth").inc()
            if not s.depth_failing:
                log.error("target %s: cannot read the depth of queues %s (%s: %s); using "
                          "%d fallback replica(s), never zero, until it can be read",
                          s.config.name, ",".join(s.config.queues), type(exc).__name__, exc,
                          s.config.rule.fallback_replicas)
            s.depth_failing = True
            return None
        if s.depth_failing:
            log.info("target %s: depth readable again", s.config.name)
            s.depth_failing = False
        for queue, depth in depths.items():
            self.metrics.observe_depth(queue, depth)
        load = total(depths)
        runnable = sum(self.blocked.ready(self.broker, q, d.ready) for q, d in depths.items())
        return Load(runnable, load.in_flight, blocked=load.ready - runnable)

    def _apply(self, s: Scaled, current: int, decision: Decision) -> int:
        """Scale if the decision differs; the replica count the target has afterwards."""
        if decision.replicas == current:
            return current
        try:
            s.target.scale(decision.replicas, current)
        except TargetError as exc:
            self._target_failed(s, exc)
            return current
        direction = "up" if decision.replicas > current else "down"
        self.metrics.scalings.labels(s.config.name, direction).inc()
        log.info("target %s: %d -> %d replicas: %s", s.config.name, current,
                 decision.replicas, decision.reason)
        if self.journal is not None:
            self.journal.scaled(s.config.name, current, decision.replicas, decision.reason)
        return decision.replicas

    def _target_failed(self, s: Scaled, exc: TargetError) -> None:
        s.error = str(exc)
        self.metrics.errors.labels(s.config.name, "target").inc()
        log.error("target %s: %s; trying again in %gs", s.config.name, exc,
                  s.config.polling_interval)

    # -- watches ----------------------------------------------------------------------------

    def _start_watches(self) -> None:
        if self._open_broker is None:
            return
        for s in self.scaled:
            c = s.config
            s.watch = ZeroWatch(c.name, c.queues, c.rule.activation_threshold,
                                self._open_broker, functools.partial(self.poke, c.name))
            s.watch.start()

    def _check_watches(self) -> None:
        for s in self.scaled:
            if s.watch is not None and s.watch.failure is not None:
                raise ConveyorError(f"autoscaler stopping: the wake-up watch of target "
                                    f"{s.config.name} died ({type(s.watch.failure).__name__}: "
                                    f"{s.watch.failure})") from s.watch.failure

    def close(self) -> None:
        """Stop watches, drain local workers, release the broker."""
        for s in self.scaled:
            if s.watch is not None:
                s.watch.stop()
        for s in self.scaled:
            try:
                s.target.close()
            except Exception as exc:
                log.error("target %s: closing failed: %s", s.config.name, exc)
        self.broker.close()
        self.blocked.close()
        if self.journal is not None:
            self.journal.close()


def build(config: AutoscalerConfig) -> tuple[Daemon, MetricsServer | None]:
    """The daemon for `config`, its targets made and its /metrics served."""
    def open_broker() -> Inspector:
        return brokers.from_url(config.broker_url or None)

    targets = [(t, make_target(t, config)) for t in config.targets]
    broker = open_broker()
    metrics = AutoscalerMetrics()
    server = None
    if config.metrics_port:
        try:
            server = MetricsServer(metrics, open_broker, config.metrics_port,
                                   config.metrics_addr, _limiter(config))
        except BaseException:
            broker.close()
            raise
    state_url = store_urls(config.broker_url, config.state_url).registry
    if state_url is None and targets:
        log.info("autoscaler: decisions are not recorded for the dashboard; give --state "
                 "(CONVEYOR_STATE_URL, or state_url in the file) to record them")
    journal = Journal(state_url) if state_url else None
    return Daemon(targets, broker, metrics, open_broker, journal=journal,
                  open_limiter=_limiter(config)), server


def _limiter(config: AutoscalerConfig) -> Callable[[], Limiter]:
    """The workers' limiter store, as `conveyor worker` finds it from the same settings."""
    env = Settings.from_env()
    where = store_urls(config.broker_url or env.broker_url, config.state_url or env.state_url,
                       limits_url=config.limits_url or env.limits_url).limits
    return lambda: limits.from_url(where)


def make_target(t: TargetConfig, config: AutoscalerConfig) -> Target:
    if t.kind == "local":
        from conveyor.autoscaler.targets.local import LocalWorkers
        return LocalWorkers(t.name, t.queues, t.rule.slots_per_replica, t.drain_timeout,
                            config.broker_url, t.worker_args)
    # Imported only when used: the Kubernetes client is large.
    from conveyor.autoscaler.targets.kubernetes import DeploymentTarget, api_client
    return DeploymentTarget(t.name, t.deployment, t.namespace or config.kubernetes.namespace,
                            api_client(config.kubernetes), t.worker_metrics_port)
