"""Trigger rules: when a task of a run may start, judged from its direct upstreams' states.

One pure function, `decide(rule, upstream_states)`, says what becomes of a pending task:

* READY: queue it now;
* SKIP: it will never run because of skips above it (`skipped`, a terminal state that
  counts as fine for the run and propagates by the same rules);
* UPSTREAM_FAILED: it will never run because of failures above it;
* WAIT: not decided yet (an upstream has not ended, and the answer depends on it).

The rules and their meanings are Airflow's (`airflow.utils.trigger_rule.TriggerRule` and
`TriggerRuleDep`, Airflow 2.x/3.x), including when each decides early: `all_success` gives
up at the first failure without waiting for the other upstreams, `one_success` starts at the
first success, `always` starts at once. A task with no upstream is always ready.

Conveyor states map onto Airflow's: `cancelled` (a task stopped by `tasks cancel`) counts as
failed; `queued`, `running`, `pending` and `up_for_retry` have not ended. The engine applies
a decision with an UPDATE guarded by `state = 'pending'` while it holds the run's lock
(`scheduler/readiness.py`), so deciding twice (two schedulers, a restart) changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

READY, SKIP, UPSTREAM_FAILED, WAIT = "ready", "skip", "upstream_failed", "wait"



class TriggerRule(StrEnum):
    """The rules by name, as Airflow's `TriggerRule` (`trigger_rule=TriggerRule.ALL_DONE`);
    a plain string (`trigger_rule="all_done"`) is the same."""

    ALL_SUCCESS = "all_success"
    ALL_FAILED = "all_failed"
    ALL_DONE = "all_done"
    ALL_SKIPPED = "all_skipped"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    ONE_DONE = "one_done"
    NONE_FAILED = "none_failed"
    NONE_FAILED_MIN_ONE_SUCCESS = "none_failed_min_one_success"
    NONE_SKIPPED = "none_skipped"
    ALWAYS = "always"


ALL_SUCCESS = TriggerRule.ALL_SUCCESS.value
#: Every rule Airflow documents, the default first.
TRIGGER_RULES = tuple(rule.value for rule in TriggerRule)

#: States a task instance never leaves by itself (only `tasks clear` or `mark` move it on).
ENDED = frozenset({"success", "failed", "upstream_failed", "skipped", "cancelled"})
#: Ended states that count as a failure, for the rules and for the run's end.
FAILURES = frozenset({"failed", "upstream_failed", "cancelled"})


def problem(rule: object) -> str:
    """Why `rule` is not a trigger rule ("" when it is), for a DAG's load error."""
    if isinstance(rule, str) and rule in TRIGGER_RULES:
        return ""
    return f"trigger_rule {rule!r} is not one of {', '.join(TRIGGER_RULES)}"


@dataclass(frozen=True)
class Tally:
    """How many direct upstreams are in each kind of state (Airflow's `_UpstreamTIStates`)."""

    total: int
    success: int
    skipped: int
    failed: int            # failed or cancelled
    upstream_failed: int

    @classmethod
    def of(cls, states: Iterable[str]) -> Tally:
        listed = list(states)
        return cls(total=len(listed), success=listed.count("success"),
                   skipped=listed.count("skipped"),
                   failed=listed.count("failed") + listed.count("cancelled"),
                   upstream_failed=listed.count("upstream_failed"))

    @property
    def done(self) -> int:
        return self.success + self.skipped + self.failed + self.upstream_failed

    @property
    def all_done(self) -> bool:
        return self.done == self.total

    @property
    def any_failure(self) -> bool:
        return self.failed + self.upstream_failed > 0


def decide(rule: str, upstream_states: Iterable[str]) -> str:
    """READY, SKIP, UPSTREAM_FAILED or WAIT for a pending task with trigger rule `rule`
    whose direct upstreams are in `upstream_states` (one entry per upstream)."""
    return judge_tally(rule, Tally.of(upstream_states))


def judge_tally(rule: str, up: Tally) -> str:
    """`decide` from the counts of the upstreams' states (what the state store counts)."""
    if up.total == 0 or rule == "always":
        return READY
    judge = _JUDGES.get(rule)
    if judge is None:
        raise ValueError(problem(rule))
    return judge(up)


def _all_success(up: Tally) -> str:
    if up.any_failure:
        return UPSTREAM_FAILED
    if up.skipped:
        return SKIP
    return READY if up.success == up.total else WAIT


def _all_failed(up: Tally) -> str:
    if up.success or up.skipped:
        return SKIP
    return READY if up.failed + up.upstream_failed == up.total else WAIT


def _all_done(up: Tally) -> str:
    return READY if up.all_done else WAIT


def _all_skipped(up: Tally) -> str:
    if up.success or up.any_failure:
        return SKIP
    return READY if up.skipped == up.total else WAIT


def _one_success(up: Tally) -> str:
    if up.success:
        return READY
    if up.all_done:
        return SKIP if up.skipped == up.total else UPSTREAM_FAILED
    return WAIT


def _one_failed(up: Tally) -> str:
    if up.any_failure:
        return READY
    return SKIP if up.all_done else WAIT


def _one_done(up: Tally) -> str:
    if up.success or up.failed:
        return READY
    return SKIP if up.all_done else WAIT


def _none_failed(up: Tally) -> str:
    if up.any_failure:
        return UPSTREAM_FAILED
    return READY if up.all_done else WAIT


def _none_failed_min_one_success(up: Tally) -> str:
    if up.any_failure:
        return UPSTREAM_FAILED
    if not up.all_done:
        return WAIT
    return SKIP if up.skipped == up.total else READY


def _none_skipped(up: Tally) -> str:
    if up.skipped:
        return SKIP
    return READY if up.all_done else WAIT


_JUDGES = {
    ALL_SUCCESS: _all_success, "all_failed": _all_failed, "all_done": _all_done,
    "all_skipped": _all_skipped, "one_success": _one_success, "one_failed": _one_failed,
    "one_done": _one_done, "none_failed": _none_failed,
    "none_failed_min_one_success": _none_failed_min_one_success,
    "none_skipped": _none_skipped,
}
