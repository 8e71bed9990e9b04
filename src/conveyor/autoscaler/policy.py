"""The scaling rule: one pure function from what a target's queues hold to its replicas.

KEDA's semantics, with the faults its users report fixed:

* desired = clamp(ceil((ready + in_flight) / slots_per_replica), min, max). Work a worker
  holds counts, so long tasks keep their workers (KEDA's RabbitMQ scaler in AMQP mode
  counts ready messages only and scales to zero under running tasks).
* A target at zero activates when ready + in_flight > activation_threshold, and goes to
  max(min, 1); the next decision sizes it (KEDA's activation phase).
* To zero only after ready and in flight were both zero for the whole cooldown, and not
  within the initial cooldown after start. (KEDA counts the cooldown from when the trigger
  went inactive, which with an activation threshold can be while work remains.) Until
  then a target with work or in its cooldown keeps at least one replica.
* Depth unreadable (`load is None`): the fallback replicas, never zero, and the quiet
  time starts over (a scaler that errors must not scale everything to zero).
* Down: the highest recommendation within the stabilisation window, never above the
  current count; up: at once (the Kubernetes HPA's default behaviour).

Time is passed in (`now`, seconds on a monotonic clock): the daemon owns the clock, the
tests drive it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Rule:
    """How one target scales; defaults are KEDA's where the issue names none."""

    slots_per_replica: int = 1
    activation_threshold: int = 0
    min_replicas: int = 0
    max_replicas: int = 10
    cooldown: float = 300.0
    initial_cooldown: float = 0.0
    stabilization_window: float = 300.0
    fallback_replicas: int = 1


@dataclass(frozen=True)
class Load:
    """What a target's queues hold, summed: due delayed messages count as ready."""

    ready: int
    in_flight: int
    blocked: int = 0  # ready on the broker but held back by a full limit: not in `ready`

    @property
    def active(self) -> int:
        return self.ready + self.in_flight

    def __str__(self) -> str:
        held = f" ({self.blocked} more blocked by limits)" if self.blocked else ""
        return f"{self.ready} ready + {self.in_flight} in flight{held}"


@dataclass(frozen=True)
class Memory:
    """What one decision passes to the next: when the queues went quiet, and the
    recommendations inside the stabilisation window as (time, replicas)."""

    started: float
    quiet_since: float | None = None
    window: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    memory: Memory


def decide(rule: Rule, current: int, load: Load | None, memory: Memory,
           now: float) -> Decision:
    """How many replicas the target should have now, why, and what to remember."""
    if load is None:
        return _fallback(rule, memory, now)
    memory = replace(memory, quiet_since=None if load.active else
                     (now if memory.quiet_since is None else memory.quiet_since))
    if current == 0:
        return _from_zero(rule, load, memory, now)
    wanted = _recommend(rule, load)
    reason = f"{load} over {rule.slots_per_replica} slots per replica"
    if wanted == 0:
        if _may_reach_zero(rule, memory, now):
            return Decision(0, f"nothing ready or in flight for the cooldown "
                               f"({rule.cooldown:g} s)", replace(memory, window=()))
        wanted, reason = 1, "nothing ready or in flight; holding one replica for the cooldown"
    memory = _remember(memory, now, wanted, rule.stabilization_window)
    if wanted >= current:
        return Decision(wanted, reason, memory)
    held = min(current, max(replicas for _, replicas in memory.window))
    if held > wanted:
        reason += (f"; {wanted} wanted, {held} kept by the stabilisation window "
                   f"({rule.stabilization_window:g} s)")
    return Decision(held, reason, memory)


def _recommend(rule: Rule, load: Load) -> int:
    wanted = math.ceil(load.active / rule.slots_per_replica)
    return min(max(wanted, rule.min_replicas), rule.max_replicas)


def _from_zero(rule: Rule, load: Load, memory: Memory, now: float) -> Decision:
    if load.active > rule.activation_threshold:
        replicas = max(rule.min_replicas, 1)
        return Decision(replicas, f"activated: {load} > activation threshold "
                                  f"{rule.activation_threshold}",
                        _remember(memory, now, replicas, rule.stabilization_window))
    if rule.min_replicas:
        return Decision(rule.min_replicas, f"below min_replicas {rule.min_replicas}",
                        _remember(memory, now, rule.min_replicas, rule.stabilization_window))
    return Decision(0, f"inactive: {load} <= activation threshold "
                       f"{rule.activation_threshold}", replace(memory, window=()))


def _may_reach_zero(rule: Rule, memory: Memory, now: float) -> bool:
    quiet = memory.quiet_since is not None and now - memory.quiet_since >= rule.cooldown
    return quiet and now - memory.started >= rule.initial_cooldown


def _fallback(rule: Rule, memory: Memory, now: float) -> Decision:
    replicas = min(max(rule.fallback_replicas, rule.min_replicas, 1), rule.max_replicas)
    memory = replace(memory, quiet_since=None)
    return Decision(replicas, "queue depth unreadable: fallback replicas",
                    _remember(memory, now, replicas, rule.stabilization_window))


def _remember(memory: Memory, now: float, replicas: int, window: float) -> Memory:
    kept = tuple((t, r) for t, r in memory.window if t >= now - window)
    return replace(memory, window=(*kept, (now, replicas)))
