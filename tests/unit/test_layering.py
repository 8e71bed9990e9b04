"""The package's import graph, read from the source: no cycles, and no import against the layers.

Layers, bottom to top (a module may import its own layer's base modules and any layer
below, never above; sibling packages of one layer stay apart):

    base:     config, settings_table, kinds, errors, message, tasks, retry, logs, events,
              locations, sqlfiles, context, flow, tracing (the core calls its hooks; only
              tracing.otel imports OpenTelemetry), signals, refusals (what a server's answer
              at first contact means), canvas (chain, group, chord: the algebra),
              pgfailover (a Postgres URL naming a primary and its standbys), redis_clients
              (the one place a Redis or Sentinel URL becomes a client)
    carriers: broker, state, limits (flow control's store)
    results:  results (task results: Redis keys beside a broker, or a state-store table),
              control (cancel: its records in flow control's store, and the control channel)
    client:   client (publishes through a broker, reads results)
    parts:    worker, scheduler, autoscaler, celery_intake
    readers:  readers (the rows operators look at: queues, workers, runs, dead letters)
    views:    ui (the web dashboard, over the readers)
    commands: cli

Lazy imports (inside a function) count: they are still a dependency, only a later one.

Each part above the broker layer names only the broker role it uses (`broker/roles.py`): the
worker and the Celery intake a consumer, the client a producer, the autoscaler an inspector,
the scheduler a consumer and an inspector, the CLI, the readers and the dashboard an
administrator; never the whole `Broker`. And no module grows past MAX_LINES.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

#: The source, read as text: importing it would fail on a cycle before the test could say where.
ROOT = Path(__file__).parents[2] / "src" / "conveyor"
LAYERS = [
    {"config", "settings_table", "kinds", "errors", "message", "tasks", "retry", "logs",
     "events", "locations", "sqlfiles", "context", "flow", "tracing", "signals", "refusals",
     "canvas", "pgfailover", "redis_clients"},
    {"broker", "state", "limits", "triggers"},
    {"results", "control"},
    {"client"},
    {"worker", "scheduler", "autoscaler", "celery_intake", "triggerer"},
    {"readers"},
    {"ui"},
    {"cli"},
]
#: Imports against the layers that are meant, each with its reason: (importer, imported).
ALLOWED = {
    ("conveyor.tasks", "conveyor.client"):
        "Task.delay()/apply_async() publish through the default client, imported when called",
    ("conveyor.tasks", "conveyor.results.handle"):
        "Task.enqueue() returns the client's ResultHandle: a type-only import",
    ("conveyor.results.handle", "conveyor.control"):
        "handle.cancel() returns the client's CancelResult: a type-only import",
    ("conveyor.state.store", "conveyor.broker.reconnect"):
        "the Postgres state store follows a failover with the transports' one retry policy "
        "(backoff, jitter, a line per attempt, retry_seconds)",
    ("conveyor.worker.cli", "conveyor.celery_intake"):
        "`conveyor worker --celery-queues` runs the Celery intake beside the worker, imported "
        "only when asked for",
    ("conveyor.celery_intake.canvas_runs", "conveyor.scheduler.canvas"):
        "a Celery chain or chord becomes the same scheduler run as the Python canvas: built "
        "by its builder",
    ("conveyor.celery_intake.canvas_runs", "conveyor.scheduler.runs"):
        "... and created as every run is (unique per DAG and logical date)",
    ("conveyor.celery_intake.canvas_runs", "conveyor.scheduler.cancel"):
        "Celery's revoke of a canvas run's task is `conveyor tasks cancel` of it",
    ("conveyor.celery_intake.run_results", "conveyor.scheduler.canvas"):
        "a canvas run's failure read back as `handle.result()` reads it",
    ("conveyor.celery_intake.intake", "conveyor.scheduler.config"):
        "canvas runs go to the scheduler's state store and control queue, from its settings",
}
#: The broker roles (broker/roles.py) each part may name; `Broker` itself only the layers
#: that open brokers (from_url) or implement them.
ROLES = {
    "conveyor.client": {"Producer"},
    "conveyor.worker": {"Consumer", "Producer"},  # followups publish on their own connection
    "conveyor.autoscaler": {"Inspector"},
    "conveyor.cli": {"Administrator", "Inspector"},
    "conveyor.ui": {"Administrator"},
    "conveyor.readers": {"Administrator"},
    "conveyor.scheduler": {"Consumer", "Inspector"},  # its daemon; the queue sampler
    "conveyor.celery_intake": {"Consumer"},
}
ROLE_NAMES = {"Broker", "Producer", "Consumer", "Inspector", "Administrator"}
BROKER_MODULES = {"conveyor.broker", "conveyor.broker.roles", "conveyor.broker.base"}
#: A module longer than this is split along what its parts do (issue 28).
MAX_LINES = 600
#: Modules over MAX_LINES while they are being split, each with who splits it: remove the
#: line when it is under.
OVERSIZE = {
}
#: The package itself is the public API (`from conveyor import task, DAG, Client`): it sits
#: above everything it re-exports and nothing inside the package imports it.
FACADE = "conveyor"


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every `conveyor` import in the file, lazy ones too."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names
                        if a.name.split(".")[0] == "conveyor")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "conveyor":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"   # `from conveyor import broker`
                yield (sub if sub in known else node.module), node.lineno


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    return {name: {target: line for target, line in imports(path, known) if target != name}
            for name, path in known.items()}


def group(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if group(module) in names)


def allowed(importer: str, imported: str) -> bool:
    if importer == FACADE or group(importer) == group(imported):
        return True
    if any(importer.startswith(a) and imported.startswith(b) for a, b in ALLOWED):
        return True
    below, same = layer(imported) < layer(importer), layer(imported) == layer(importer)
    return below or (same and layer(importer) == 0)


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted({group(m) for m in modules() if m != FACADE}
                      - set().union(*LAYERS))
    assert not unplaced, f"put these in a layer of this test: {unplaced}"


def test_no_import_goes_up_or_sideways() -> None:
    paths = modules()
    wrong = [f"{paths[name]}:{line}: {name} imports {target}"
             for name, targets in graph().items() for target, line in targets.items()
             if target != FACADE and not allowed(name, target)]
    assert not wrong, "imports against the layering (see this test's docstring):\n" + \
        "\n".join(wrong)


def test_every_allowed_exception_is_still_needed() -> None:
    edges = {(a, b) for a, targets in graph().items() for b in targets}
    stale = [pair for pair in ALLOWED
             if not any(a.startswith(pair[0]) and b.startswith(pair[1]) for a, b in edges)]
    assert not stale, f"remove these exceptions, nothing needs them: {stale}"


def test_no_import_cycle() -> None:
    edges = graph()
    cycles = [cycle for cycle in (_cycle_from(start, edges) for start in edges) if cycle]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _cycle_from(start: str, edges: dict[str, dict[str, int]]) -> list[str]:
    """A path start -> ... -> start, if there is one (depth-first)."""
    path, seen = [start], set()

    def walk(node: str) -> bool:
        for nxt in edges.get(node, {}):
            if nxt == start:
                path.append(nxt)
                return True
            if nxt in edges and nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                if walk(nxt):
                    return True
                path.pop()
        return False

    return path if walk(start) else []


def test_the_worker_command_loads_only_what_a_worker_needs() -> None:
    """`conveyor worker` builds a lean parser: no scheduler daemon, autoscaler, state store
    client or operator command is imported (the worker's footprint, in every process)."""
    code = ("import sys; from conveyor import cli; cli.build_parser('worker'); "
            "print('\\n'.join(m for m in sys.modules if m.startswith('conveyor')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    heavy = [m for m in loaded if m.startswith(("conveyor.autoscaler", "conveyor.cli.",
                                                "conveyor.state", "conveyor.celery_intake"))
             or (m.startswith("conveyor.scheduler.")
                 and m not in ("conveyor.scheduler.dag", "conveyor.scheduler.errors",
                               "conveyor.scheduler.rules",   # rules: pure, no imports
                               "conveyor.scheduler.alerts",   # DAG(deadline=...)
                               # the canvas's DAG builder, which `import conveyor` sets up
                               "conveyor.scheduler.canvas"))]
    assert "conveyor.worker.cli" in loaded and not heavy, heavy


def broker_roles(path: Path) -> Iterator[tuple[str, int]]:
    """(role name, line) for every broker role or `Broker` the file names: imported from
    the broker package, or reached through it as a module (`brokers.Inspector`)."""
    tree = ast.parse(path.read_text())
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module in BROKER_MODULES and alias.name in ROLE_NAMES:
                    yield alias.name, node.lineno
                if f"{node.module}.{alias.name}" == "conveyor.broker":
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "conveyor.broker" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ROLE_NAMES and \
                isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield node.attr, node.lineno


def test_each_part_names_only_the_broker_role_it_uses() -> None:
    paths = modules()
    wrong = [f"{paths[name]}:{line}: {name} names {role}; it may name {sorted(allowed)}"
             for name in sorted(paths)
             for part, allowed in ROLES.items() if name == part or name.startswith(part + ".")
             for role, line in broker_roles(paths[name]) if role not in allowed]
    assert not wrong, "depend on the narrow broker role (broker/roles.py):\n" + "\n".join(wrong)


def test_the_role_check_sees_imports_and_module_attributes(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from conveyor.broker import Broker, Depth\n"
                      "from conveyor import broker as brokers\n"
                      "def f(b: brokers.Inspector) -> None: ...\n")
    assert sorted(broker_roles(source)) == [("Broker", 1), ("Inspector", 3)]


def test_no_module_is_longer_than_the_limit() -> None:
    long = [f"{path}: {n} lines" for path, n in lengths().items()
            if n > MAX_LINES and path not in OVERSIZE]
    assert not long, f"split these along what their parts do (over {MAX_LINES} lines):\n" + \
        "\n".join(long)


def test_every_oversize_exception_is_still_needed() -> None:
    stale = [path for path in OVERSIZE if lengths().get(path, 0) <= MAX_LINES]
    assert not stale, f"remove these from OVERSIZE, they are short enough now: {stale}"


def lengths() -> dict[str, int]:
    return {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
            for path in ROOT.rglob("*.py")}
