"""Outcome classification and the settle decision: every rule, as tables."""

from __future__ import annotations

import signal

import pytest

from conveyor.worker.outcome import (
    Action,
    Budget,
    Facts,
    Outcome,
    classify,
    decide,
    over_delivery_cap,
)

EXIT_0 = 0
EXIT_1 = 1 << 8
SIGKILLED = signal.SIGKILL
SIGSEGV = signal.SIGSEGV


@pytest.mark.parametrize("facts, kind", [
    (Facts({"outcome": "succeeded", "result": 3}, EXIT_0), "succeeded"),
    (Facts({"outcome": "failed", "error": {"type": "KeyError"}}, EXIT_0), "failed"),
    (Facts({"outcome": "retry_requested", "retry_delay": 5}, EXIT_0), "retry_requested"),
    (Facts({"outcome": "timed_out"}, EXIT_0), "timed_out"),
    # the cgroup's OOM counter decides, whatever the report or signal says
    (Facts(None, SIGKILLED, oom_killed=True), "oom_killed"),
    (Facts({"outcome": "succeeded"}, EXIT_0, oom_killed=True), "oom_killed"),
    # SIGKILL without an OOM count is not an OOM kill
    (Facts(None, SIGKILLED), "killed"),
    (Facts(None, SIGSEGV), "killed"),
    (Facts(None, SIGKILLED, hard_timed_out=True), "timed_out"),
    (Facts(None, SIGKILLED, interrupted=True), "interrupted"),
    (Facts(None, EXIT_1), "failed"),
    (Facts({"outcome": "succeeded"}, EXIT_1), "failed"),  # reported, then crashed on exit
    (Facts(None, None), "lost"),
    # a cancelled run is cancelled however it ended: stopped, killed, or even finished
    (Facts({"outcome": "cancelled"}, EXIT_0, cancelled=True), "cancelled"),
    (Facts(None, SIGKILLED, cancelled=True), "cancelled"),
    (Facts({"outcome": "succeeded"}, EXIT_0, cancelled=True), "cancelled"),
    (Facts(None, SIGKILLED, interrupted=True, cancelled=True), "cancelled"),  # not requeued
])
def test_classify(facts: Facts, kind: str) -> None:
    assert classify(facts).kind == kind


def test_classify_keeps_result_and_error() -> None:
    assert classify(Facts({"outcome": "succeeded", "result": [1]}, EXIT_0)).result == [1]
    failed = classify(Facts({"outcome": "failed", "error": {"type": "E", "message": "m"}}, 0))
    assert failed.error == {"type": "E", "message": "m"}
    assert "SIGSEGV" in classify(Facts(None, SIGSEGV)).reason
    extra = {"s3://lake/orders": {"rows": 3}}
    assert classify(Facts({"outcome": "succeeded", "asset_extra": extra},
                          EXIT_0)).asset_extra == extra


BUDGET = Budget(max_retries=3, max_deliveries=20, backoff=1.0, backoff_max=10.0)


@pytest.mark.parametrize("outcome, attempt, verb", [
    (Outcome("succeeded"), 1, "ack"),
    (Outcome("failed"), 1, "retry"),
    (Outcome("failed"), 3, "retry"),
    (Outcome("failed"), 4, "dead_letter"),  # 3 retries after the first attempt: spent
    (Outcome("oom_killed"), 1, "retry"),
    (Outcome("oom_killed"), 4, "dead_letter"),
    (Outcome("timed_out"), 4, "dead_letter"),
    (Outcome("killed"), 2, "retry"),
    (Outcome("interrupted"), 50, "requeue"),  # never spends the retry budget
    (Outcome("cancelled"), 1, "ack"),  # never retried nor dead-lettered
    (Outcome("cancelled"), 50, "ack"),
])
def test_decide(outcome: Outcome, attempt: int, verb: str) -> None:
    assert decide(outcome, attempt, BUDGET).verb == verb


def test_oom_dead_letter_reason_names_oom() -> None:
    action = decide(Outcome("oom_killed", reason="over its memory cap"), 4, BUDGET)
    assert action.verb == "dead_letter" and action.reason.startswith("oom_killed")
    assert "budget spent" in action.reason


def test_retry_delay_follows_backoff_with_cap() -> None:
    delays = [decide(Outcome("failed"), a, Budget(max_retries=99, backoff=1.0,
                                                  backoff_max=10.0)).delay for a in range(1, 9)]
    assert all(0 < d <= 10.0 for d in delays)
    assert delays[-1] == 10.0 and delays[0] < 3


def test_task_asked_delay_wins() -> None:
    assert decide(Outcome("retry_requested", retry_delay=42.0), 1, BUDGET).delay == 42.0


def test_report_only_acks_failures() -> None:
    assert decide(Outcome("failed"), 1, BUDGET, report_only=True) == Action(
        "ack", reason="failed")
    assert decide(Outcome("interrupted"), 1, BUDGET, report_only=True).verb == "requeue"


def test_delivery_cap() -> None:
    assert over_delivery_cap(20, BUDGET) is None
    capped = over_delivery_cap(21, BUDGET)
    assert capped is not None and capped.verb == "dead_letter" and "21 times" in capped.reason


@pytest.mark.parametrize("status, kind", [(71 << 8, "failed"), (SIGKILLED, "killed"),
                                          (None, "lost")])
def test_a_runner_that_dies_unreported_is_quoted(status: int | None, kind: str) -> None:
    """Why it died (e.g. a failed setresuid) is in the reason, not only an exit code."""
    words = "runner 7 cannot isolate itself: setresuid(1000) failed with EPERM"
    outcome = classify(Facts(None, status, last_words=words))
    assert outcome.kind == kind
    assert outcome.reason.endswith(f"its last output: {words}")
    assert "its last output" not in classify(Facts(None, status)).reason


def test_a_skip_is_acked_never_retried_even_with_budget_left() -> None:
    """A task that raised Skip (or a command exiting with a skip code) is not a fault."""
    skipped = classify(Facts({"outcome": "skipped", "reason": "nothing to do"}, EXIT_0))
    assert skipped == Outcome("skipped", reason="nothing to do")
    assert decide(skipped, 1, Budget(max_retries=3)).verb == "ack"
    assert decide(skipped, 1, Budget(max_retries=3), report_only=True).verb == "ack"


def test_a_command_exiting_with_a_skip_code_is_skipped_and_other_codes_fail() -> None:
    from conveyor.message import skip_codes
    from conveyor.worker.outcome import exec_report

    codes = skip_codes({"skip_exit_codes": "99,100"})
    assert codes == {99, 100} and skip_codes({}) == frozenset()
    report = exec_report(99 << 8, codes)
    assert report["outcome"] == "skipped" and "code 99 (skip_on_exit_code)" in report["reason"]
    # exec'd: the runner's exit status is the command's, and the report decides
    assert classify(Facts(report, 99 << 8)).kind == "skipped"
    assert exec_report(99 << 8)["outcome"] == "failed"          # no skip codes: a failure
    assert exec_report(EXIT_1, codes)["outcome"] == "failed"
