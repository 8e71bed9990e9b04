"""Trigger rules against Airflow's documented semantics, as a table.

Airflow's docs ("Trigger Rules", core concepts / DAGs) and its TriggerRuleDep: each row is
(rule, the states of a task's direct upstreams, what becomes of the task). `decide` is the
one function the scheduler asks (scheduler/readiness.py applies its answer).
"""

from __future__ import annotations

import pytest

from conveyor.scheduler.rules import (
    READY,
    SKIP,
    TRIGGER_RULES,
    UPSTREAM_FAILED,
    WAIT,
    decide,
    problem,
)

S, F, K, U, R, C = "success", "failed", "skipped", "upstream_failed", "running", "cancelled"

TABLE = [
    # all_success (default): all upstreams succeeded; a failure fails it at once, a skip skips it
    ("all_success", [S, S], READY),
    ("all_success", [S, R], WAIT),
    ("all_success", [F, R], UPSTREAM_FAILED),
    ("all_success", [U, S], UPSTREAM_FAILED),
    ("all_success", [C, S], UPSTREAM_FAILED),
    ("all_success", [K, S], SKIP),
    ("all_success", [K, F], UPSTREAM_FAILED),
    ("all_success", ["up_for_retry"], WAIT),
    # all_failed: every upstream failed or upstream_failed; a success or a skip skips it
    ("all_failed", [F, U], READY),
    ("all_failed", [F, R], WAIT),
    ("all_failed", [F, S], SKIP),
    ("all_failed", [F, K], SKIP),
    # all_done: every upstream ended, however
    ("all_done", [S, F, K, U], READY),
    ("all_done", [F, R], WAIT),
    ("all_done", [C], READY),
    # all_skipped: every upstream skipped; anything else ending skips it
    ("all_skipped", [K, K], READY),
    ("all_skipped", [K, R], WAIT),
    ("all_skipped", [K, S], SKIP),
    ("all_skipped", [K, F], SKIP),
    # one_success: at the first success, without waiting for the others
    ("one_success", [S, R], READY),
    ("one_success", [F, R], WAIT),
    ("one_success", [F, K], UPSTREAM_FAILED),
    ("one_success", [K, K], SKIP),
    # one_failed: at the first failure, without waiting; none when all ended skips it
    ("one_failed", [F, R], READY),
    ("one_failed", [U, R], READY),
    ("one_failed", [S, R], WAIT),
    ("one_failed", [S, K], SKIP),
    # one_done: at the first success or failure
    ("one_done", [S, R], READY),
    ("one_done", [F, R], READY),
    ("one_done", [K, R], WAIT),
    ("one_done", [K, U], SKIP),
    # none_failed: nothing failed (success or skipped), all ended
    ("none_failed", [S, K], READY),
    ("none_failed", [K, K], READY),
    ("none_failed", [S, R], WAIT),
    ("none_failed", [S, F], UPSTREAM_FAILED),
    ("none_failed", [U, R], UPSTREAM_FAILED),
    # none_failed_min_one_success: nothing failed, all ended, at least one success
    ("none_failed_min_one_success", [S, K], READY),
    ("none_failed_min_one_success", [K, K], SKIP),
    ("none_failed_min_one_success", [S, R], WAIT),
    ("none_failed_min_one_success", [F, S], UPSTREAM_FAILED),
    # none_skipped: no upstream skipped, all ended (success, failed or upstream_failed)
    ("none_skipped", [S, F, U], READY),
    ("none_skipped", [S, R], WAIT),
    ("none_skipped", [K, R], SKIP),
    # always: at once, whatever the upstreams do
    ("always", [R, "pending"], READY),
    ("always", [F, K], READY),
]


@pytest.mark.parametrize(("rule", "states", "expected"), TABLE,
                         ids=[f"{r}-{'+'.join(s)}" for r, s, _ in TABLE])
def test_rule_table(rule: str, states: list[str], expected: str) -> None:
    assert decide(rule, states) == expected


def test_every_rule_is_in_the_table() -> None:
    assert {rule for rule, _, _ in TABLE} == set(TRIGGER_RULES)
    assert TRIGGER_RULES[0] == "all_success"


@pytest.mark.parametrize("rule", TRIGGER_RULES)
def test_a_task_without_upstreams_is_ready_whatever_its_rule(rule: str) -> None:
    assert decide(rule, []) == READY


@pytest.mark.parametrize("rule", TRIGGER_RULES)
def test_order_of_upstreams_does_not_matter(rule: str) -> None:
    states = [S, F, K, R]
    assert decide(rule, states) == decide(rule, list(reversed(states)))


def test_unknown_rule_is_refused_naming_the_valid_ones() -> None:
    assert problem("all_succes").startswith("trigger_rule 'all_succes' is not one of all_success")
    assert problem("always") == ""
    assert problem(None) != ""
    with pytest.raises(ValueError, match="none_failed_min_one_success"):
        decide("bogus", [S])


def test_a_dag_task_with_an_unknown_rule_is_refused_at_load_naming_task_and_rules() -> None:
    from conveyor.scheduler import DAG
    from conveyor.scheduler.errors import DagError

    dag = DAG("rules_refused")
    with pytest.raises(DagError) as caught:
        dag.command("cleanup", ["true"], trigger_rule="all_sucess")
    message = str(caught.value)
    assert "task 'cleanup' of DAG 'rules_refused'" in message
    assert "trigger_rule 'all_sucess' is not one of all_success" in message
    assert "\n" not in message
    node = dag.command("alert", ["true"], trigger_rule="one_failed")
    assert node.spec()["trigger_rule"] == "one_failed"
    assert dag.command("plain", ["true"]).spec()["trigger_rule"] == "all_success"


# -- branches (pure): what a branch's return value follows --------------------------------

def test_a_branch_follows_what_it_names_and_what_is_below_it() -> None:
    from conveyor.scheduler.branches import follows, reach

    edges = [("pick", "a"), ("pick", "b"), ("pick", "join"), ("a", "a2"), ("a2", "join")]
    below = reach(["a", "b", "join"], edges)
    assert below == {"a": ["a2", "join"], "b": [], "join": []}
    assert follows("a", below, "a") and follows(["a"], below, "join")
    assert not follows("a", below, "b") and not follows("b", below, "join")
    assert not follows(None, below, "a") and not follows([], below, "a")
    assert not follows(42, below, "a")       # never followed: the attempt failed instead


@pytest.mark.parametrize(("result", "problem_text"), [
    ("a", ""), (["a", "b"], ""), (None, ""), ([], ""),
    ("c", "returned 'c': not a direct downstream task of it (its direct downstream tasks: a, b)"),
    (["a", "c", "d"], "returned 'c', 'd': not a direct downstream"),
    ({"a": 1}, "returned {'a': 1}: a branch returns the id of a direct downstream task"),
    ([1], "returned [1]: a branch returns"),
])
def test_what_a_branch_may_return(result: object, problem_text: str) -> None:
    from conveyor.scheduler.branches import choice_problem

    found = choice_problem(result, "pick", ["b", "a"])
    assert (found == "") if not problem_text else (problem_text in found)
    assert "\n" not in found


def test_dag_branch_marks_the_task_and_the_run_keeps_what_each_child_leads_to() -> None:
    import json

    from conveyor.scheduler import DAG
    from conveyor.scheduler.runs import ti_row

    dag = DAG("branching")
    pick = dag.branch("flows.pick", retries=1)
    a, b = dag.command("a", ["true"]), dag.command("b", ["true"])
    pick >> [a, b]
    a >> dag.command("after_a", ["true"])
    assert pick.branch and not a.branch
    spec = json.loads(ti_row(dag, "pick", 0, "r", 0.0, ["queue"], {}, ["a", "b"])["spec"])
    assert spec["branch"] == {"a": ["after_a"], "b": []}
    # the readiness queries count branches by this column, not by the spec's JSON text
    assert ti_row(dag, "pick", 0, "r", 0.0, ["queue"], {}, ["a", "b"])["is_branch"] == 1
    assert ti_row(dag, "a", 1, "r", 0.0, ["queue"], {}, [])["is_branch"] == 0
    assert "branch" not in json.loads(ti_row(dag, "a", 1, "r", 0.0, ["queue"], {}, [])["spec"])


def test_airflow_style_enum_members_are_the_same_rules() -> None:
    from conveyor import DAG, TriggerRule

    assert TRIGGER_RULES == tuple(TriggerRule)
    dag = DAG("rules_enum")
    node = dag.command("cleanup", ["true"], trigger_rule=TriggerRule.ALL_DONE)
    assert node.spec()["trigger_rule"] == "all_done"
    assert type(node.options.trigger_rule) is str
    assert decide(TriggerRule.ONE_FAILED, [F]) == READY
