"""Branches: a task that returns which of its direct downstream tasks to follow.

    choose = dag.branch(pick_path)          # Airflow's @task.branch / BranchPythonOperator
    choose >> [full_load, incremental]      # pick_path returns "full_load" (or a list)

The direct downstream tasks it did not name are skipped (and what depends on them follows
its trigger rule). As in Airflow, a direct downstream that is also below a followed task
(the `join` of `branch >> [a, join]; a >> join`) is not skipped, and returning None or []
follows nothing. Returning an id that is not a direct downstream fails the branch task.

Pure functions: the run keeps, in the branch task's spec, which tasks each direct
downstream leads to (`reach`, computed when the run is created), and what the branch
returned is its result; `readiness.py` asks `follows` while judging a child.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def chosen(result: Any) -> list[str] | None:
    """The task ids a branch's return value names; None if it is not an id, a list of
    ids, or None (nothing)."""
    if result is None:
        return []
    if isinstance(result, str):
        return [result]
    if isinstance(result, (list, tuple)) and all(isinstance(r, str) for r in result):
        return list(result)
    return None


def choice_problem(result: Any, task_id: str, downstream: Sequence[str]) -> str:
    """Why a branch task's return value cannot be followed ("" when it can): the error
    its attempt fails with."""
    ids = chosen(result)
    options = ", ".join(sorted(downstream)) or "none"
    if ids is None:
        return (f"branch task {task_id!r} returned {result!r}: a branch returns the id of "
                f"a direct downstream task to follow, or a list of them (its direct "
                f"downstream tasks: {options})")
    unknown = sorted(set(ids) - set(downstream))
    if unknown:
        return (f"branch task {task_id!r} returned {', '.join(map(repr, unknown))}: not "
                f"a direct downstream task of it (its direct downstream tasks: {options})")
    return ""


def reach(children: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """For each direct downstream of a branch, every task below it (for `follows`)."""
    below: dict[str, list[str]] = {}
    for up, down in edges:
        below.setdefault(up, []).append(down)
    found: dict[str, list[str]] = {}
    for child in children:
        seen: set[str] = set()
        stack = list(below.get(child, []))
        while stack:
            task_id = stack.pop()
            if task_id not in seen:
                seen.add(task_id)
                stack += below.get(task_id, [])
        found[child] = sorted(seen)
    return found


def follows(result: Any, reach_of: Mapping[str, Sequence[str]], child: str) -> bool:
    """Whether a branch that returned `result` follows its direct downstream `child`:
    named, or below a task it named. A result that names nothing valid follows nothing."""
    ids = chosen(result) or []
    return child in ids or any(child in reach_of.get(task_id, ()) for task_id in ids)
