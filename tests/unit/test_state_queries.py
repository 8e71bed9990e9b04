"""Only `state/` names the state store's queries: every other module goes through its typed
repositories (state/runs.py, state/tasks.py, state/monitoring.py), so a query renamed or a
column added is changed in one package, and callers read records, not dicts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conveyor import sqlfiles

ROOT = Path(__file__).parents[2] / "src" / "conveyor"
#: The raw methods of `state.store.Store`.
RAW = {"rows", "one", "exec", "exec_many"}
#: Packages with their own named-query databases (limits/sql.py's `rows` is its own).
OWN_QUERIES = ("state", "limits")


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] not in OWN_QUERIES:
            yield str(relative), ast.parse(path.read_text(), str(path))


def raw_calls(tree: ast.Module) -> list[str]:
    """`x.rows(...)`, `x.one(...)`, `x.exec(...)`, `x.exec_many(...)` in `tree`, and any
    call whose first argument is a state query's name (one of two words or more: "run" or
    "workers" alone are ordinary words)."""
    names = {n for n in sqlfiles.load("conveyor.state", "sql/sqlite.sql") if "_" in n}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        first = node.args[0] if node.args else None
        named = isinstance(first, ast.Constant) and first.value in names
        if (isinstance(node.func, ast.Attribute) and node.func.attr in RAW) or named:
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_module_outside_state_runs_a_named_query() -> None:
    offenders = {name: calls for name, tree in modules() if (calls := raw_calls(tree))}
    assert offenders == {}, "use a repository of conveyor.state (runs, tasks, monitoring)"


def test_the_check_finds_a_raw_call_and_a_query_name() -> None:
    tree = ast.parse('store.rows("run_tis", run_id=r)\nput("finish_run", x)\nok("x", "run_tis")')
    assert [line[:6] for line in raw_calls(tree)] == ["line 1", "line 2"]
