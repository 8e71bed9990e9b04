"""The state store: migrations on start, named queries, transactions; and the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.errors import ConfigError
from conveyor.scheduler.config import SchedulerConfig
from conveyor.state.store import SQLiteStore, from_url


def test_migrations_apply_once_and_upgrade_an_old_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    old = SQLiteStore(url)
    with old.transaction():                     # a store created by the first release
        old._script(old.queries["schema_table"])
        old._script(old.queries["migration_0001"])
        old.exec("set_schema_version", version=1)
    old.close()
    store = from_url(url)
    store.migrate()                             # and again: nothing to do
    versions = [r["version"] for r in store.rows("schema_version")]
    indexes = {r["name"] for r in store._execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'", {})[0]}
    latest = max(int(q.rsplit("_", 1)[1]) for q in store.queries if q.startswith("migration_"))
    store.close()
    assert versions == [latest] and latest >= 4
    assert "conveyor_ti_unfinished" in indexes


def test_a_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    store = from_url(f"sqlite:///{tmp_path}/state.db")
    with pytest.raises(RuntimeError), store.transaction():
        store.exec("upsert_dag", dag_id="d", version="v", file="f", schedule=None,
                   timezone="UTC", next_tick=None, now=1.0)
        with store.transaction():               # nested: joins the outer one
            raise RuntimeError("boom")
    assert store.rows("dags") == []
    store.close()


def test_unknown_store_scheme_is_a_readable_error() -> None:
    with pytest.raises(ConfigError, match="unknown scheme 'mysql'"):
        from_url("mysql://x/y")


def test_settings_precedence_flags_over_environment() -> None:
    env = {"CONVEYOR_EXECUTORS": "local,queue", "CONVEYOR_LOCAL_SLOTS": "8",
           "CONVEYOR_STATE_URL": "sqlite:///from-env.db"}
    config = SchedulerConfig.from_env(env, state_url="sqlite:///flag.db", local_slots=None)
    assert config.executors == ("local", "queue") and config.local_slots == 8
    assert config.settings.state_url == "sqlite:///flag.db"
    with pytest.raises(ConfigError, match="CONVEYOR_LOCAL_SLOTS='many' is not allowed: must "
                                          "be a whole number"):
        SchedulerConfig.from_env({"CONVEYOR_LOCAL_SLOTS": "many"})
    with pytest.raises(ConfigError, match="needs an image"):
        SchedulerConfig.from_env({"CONVEYOR_EXECUTORS": "kubernetes"})

