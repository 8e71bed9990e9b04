"""The scaling rule, table by table: every rule of the issue, with the clock driven by hand."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from conveyor.autoscaler.policy import Decision, Load, Memory, Rule, decide

RULE = Rule(slots_per_replica=4, activation_threshold=0, min_replicas=0, max_replicas=5,
            cooldown=60, initial_cooldown=0, stabilization_window=0, fallback_replicas=2)


def once(current: int, load: Load | None, rule: Rule = RULE, now: float = 1000.0) -> Decision:
    """One decision with a fresh memory that has been quiet forever (cooldown passed)."""
    return decide(rule, current, load, Memory(started=0.0, quiet_since=0.0), now)


@pytest.mark.parametrize("current,ready,in_flight,expected", [
    # desired = clamp(ceil((ready + in_flight) / 4), 0, 5)
    (1, 1, 0, 1),
    (1, 4, 0, 1),
    (1, 5, 0, 2),
    (1, 0, 5, 2),    # in flight counts as much as ready
    (2, 3, 4, 2),
    (1, 16, 4, 5),
    (1, 1000, 0, 5),  # clamped to max
    (9, 1000, 0, 5),  # above max: back to max
    (3, 0, 1, 1),     # one long task still running: its worker stays
])
def test_replicas_follow_ready_plus_in_flight(current: int, ready: int, in_flight: int,
                                              expected: int) -> None:
    assert once(current, Load(ready, in_flight)).replicas == expected


@pytest.mark.parametrize("min_replicas,current,active,expected", [
    (0, 1, 1, 1),
    (2, 1, 1, 2),    # clamped to min
    (2, 2, 0, 2),    # min holds with nothing to do
    (3, 0, 0, 3),    # below min at zero: raised to min
])
def test_min_replicas(min_replicas: int, current: int, active: int, expected: int) -> None:
    rule = replace(RULE, min_replicas=min_replicas)
    assert once(current, Load(active, 0), rule).replicas == expected


@pytest.mark.parametrize("threshold,min_replicas,ready,in_flight,expected", [
    (0, 0, 0, 0, 0),     # nothing: stays at zero
    (0, 0, 1, 0, 1),     # the first message activates, to max(min, 1)
    (0, 0, 100, 0, 1),   # from zero to max(min, 1) only; the next decision sizes it
    (0, 2, 1, 0, 2),
    (5, 0, 5, 0, 0),     # active only above the activation threshold
    (5, 0, 3, 3, 1),     # ready + in flight counts against it
    (5, 0, 6, 0, 1),
])
def test_activation_from_zero(threshold: int, min_replicas: int, ready: int, in_flight: int,
                              expected: int) -> None:
    rule = replace(RULE, activation_threshold=threshold, min_replicas=min_replicas)
    assert once(0, Load(ready, in_flight), rule).replicas == expected


def test_activation_threshold_does_not_scale_a_busy_target_to_zero() -> None:
    """Below the threshold but with work left, a running target keeps a replica: the
    cooldown counts only time with nothing ready and nothing in flight."""
    rule = replace(RULE, activation_threshold=10)
    assert once(3, Load(2, 1), rule).replicas == 1


def run(rule: Rule, steps: Sequence[tuple[float, Load | None]], current: int = 1,
        started: float = 0.0) -> list[int]:
    """Decisions over time, each applied before the next: [replicas after each step]."""
    memory = Memory(started=started)
    out = []
    for now, load in steps:
        decision = decide(rule, current, load, memory, now)
        current, memory = decision.replicas, decision.memory
        out.append(current)
    return out


def test_to_zero_only_after_the_whole_cooldown_idle() -> None:
    idle, busy = Load(0, 0), Load(3, 0)
    steps = [(0, busy), (10, idle), (40, idle), (69.9, idle), (70, idle)]
    assert run(RULE, steps) == [1, 1, 1, 1, 0]


def test_work_during_the_cooldown_restarts_it() -> None:
    idle = Load(0, 0)
    steps = [(0, idle), (50, Load(0, 1)), (60, idle), (100, idle), (119, idle), (120, idle)]
    assert run(RULE, steps) == [1, 1, 1, 1, 1, 0]


def test_in_flight_work_never_reaches_zero() -> None:
    """Scenario 6: an empty ready queue with tasks still running is not idle."""
    running = Load(0, 2)
    assert run(RULE, [(t, running) for t in range(0, 1000, 100)]) == [1] * 10


def test_initial_cooldown_holds_zero_off_after_start() -> None:
    rule = replace(RULE, cooldown=0, initial_cooldown=30)
    idle = Load(0, 0)
    assert run(rule, [(0, idle), (29, idle), (30, idle)]) == [1, 1, 0]


def test_zero_cooldown_goes_to_zero_at_once() -> None:
    assert run(replace(RULE, cooldown=0), [(0, Load(0, 0))], current=3) == [0]


@pytest.mark.parametrize("current,fallback,min_replicas,max_replicas,expected", [
    (0, 2, 0, 5, 2),   # at zero: up to the fallback, never leave it at zero
    (4, 2, 0, 5, 2),   # the fallback, as KEDA does
    (1, 9, 0, 5, 5),   # clamped to max
    (1, 1, 3, 5, 3),   # and to min
])
def test_fallback_on_unreadable_depth(current: int, fallback: int, min_replicas: int,
                                      max_replicas: int, expected: int) -> None:
    rule = replace(RULE, fallback_replicas=fallback, min_replicas=min_replicas,
                   max_replicas=max_replicas)
    decision = once(current, None, rule)
    assert decision.replicas == expected
    assert "unreadable" in decision.reason


def test_errors_never_scale_to_zero_and_restart_the_cooldown() -> None:
    idle = Load(0, 0)
    steps = [(0, idle), (50, None), (61, idle), (100, idle), (121, idle)]
    assert run(RULE, steps) == [1, 2, 1, 1, 0]  # quiet again from t=61 only


def test_scale_down_keeps_the_highest_recommendation_in_the_window() -> None:
    rule = replace(RULE, stabilization_window=30, cooldown=1000)
    steps = [(0, Load(20, 0)), (10, Load(8, 0)), (20, Load(4, 0)), (31, Load(4, 0)),
             (41, Load(4, 0)), (51, Load(4, 0))]
    # recommendations 5, 2, 1, 1, 1, 1: 5 stays until t=30 has passed, 2 until t=40
    assert run(rule, steps) == [5, 5, 5, 2, 1, 1]


def test_scale_up_is_immediate_inside_the_window() -> None:
    rule = replace(RULE, stabilization_window=300)
    steps = [(0, Load(4, 0)), (1, Load(20, 0)), (2, Load(4, 0)), (3, Load(40, 0))]
    assert run(rule, steps) == [1, 5, 5, 5]


def test_window_never_raises_above_current() -> None:
    """Someone scaled the target down by hand: the window does not scale it back up."""
    rule = replace(RULE, stabilization_window=300)
    first = decide(rule, 1, Load(20, 0), Memory(started=0), 0)
    assert first.replicas == 5
    again = decide(rule, 2, Load(4, 0), first.memory, 1)
    assert again.replicas == 2


def test_zero_is_not_held_by_the_window() -> None:
    """Scale to zero is the cooldown's call, as in KEDA (it bypasses the HPA window)."""
    rule = replace(RULE, stabilization_window=600, cooldown=60)
    steps = [(0, Load(20, 0)), (10, Load(0, 0)), (70, Load(0, 0))]
    assert run(rule, steps) == [5, 5, 0]


def test_a_full_day() -> None:
    """Quiet night at zero, a burst, the drain, back to zero after the cooldown."""
    rule = replace(RULE, stabilization_window=20)
    steps = [(0, Load(0, 0)), (5, Load(0, 0)),       # at zero, quiet
             (6, Load(30, 0)),                          # burst: activate to 1
             (11, Load(26, 4)),                         # sized: 30 / 4 -> 8 -> max 5
             (16, Load(6, 4)),                          # 10 / 4 -> 3, window holds 5
             (40, Load(0, 2)),                          # 1, window expired
             (45, Load(0, 0)), (104, Load(0, 0)), (105, Load(0, 0))]
    assert run(rule, steps, current=0) == [0, 0, 1, 5, 5, 1, 1, 1, 0]


def test_reasons_say_why() -> None:
    assert "activated" in once(0, Load(1, 0)).reason
    assert "cooldown" in once(1, Load(0, 0)).reason
    assert "1 ready + 2 in flight" in once(1, Load(1, 2)).reason
