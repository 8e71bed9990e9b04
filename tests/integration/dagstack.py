"""One DAG file run by a real scheduler and worker: the set-up the scheduler's end-to-end
tests share (branches, mapping, callbacks, skips).

`dag_stack` writes the DAG file into a DAGs folder of the test's own and yields the
environment the `conveyor` commands run with: the broker on the same database as the state
store (an SQLite file beside it, or a Postgres schema of the test's own, dropped after)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import POSTGRES_URL, drop_postgres_schema
from tests.support import conveyor

#: Seconds a scheduler's event lease lasts here: a killed one is replaced this soon.
LEASE = "2"


@contextmanager
def dag_stack(state_url: str, unique: str, tmp_path: Path, file_name: str,
              source: str) -> Iterator[dict[str, str]]:
    """The environment for a DAG folder holding `file_name` with `source`."""
    postgres = state_url.startswith("postgresql")
    broker = f"{POSTGRES_URL}?schema={unique}b" if postgres else \
        f"sqlite:///{tmp_path}/broker.db"
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / file_name).write_text(source)
    try:
        yield {"CONVEYOR_BROKER_URL": broker, "CONVEYOR_STATE_URL": state_url,
               "CONVEYOR_DAGS_FOLDER": str(tmp_path / "dags"),
               "CONVEYOR_SCHEDULER_EVENT_LEASE": LEASE, "CONVEYOR_LOG_LEVEL": "WARNING"}
    finally:
        if postgres:
            drop_postgres_schema(f"{unique}b")


def trigger_run(env: dict[str, str], dag_id: str) -> str:
    """`conveyor dags trigger DAG --json`: the new run's id."""
    out = conveyor("dags", "trigger", dag_id, "--json", env=env).stdout
    return str(json.loads(out)["run_id"])


def ledger_lines(tmp_path: Path) -> list[str]:
    """What the DAG's tasks wrote to the test's ledger, sorted (none yet: [])."""
    path = tmp_path / "ledger"
    return sorted(path.read_text().split()) if path.exists() else []
