"""`conveyor limits set|list|clear` as a user runs them, on the embedded SQLite store; the
limit set here is the one a worker's admission then applies."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conveyor import limits
from conveyor.flow import Spec
from conveyor.limits import Parcel
from conveyor.locations import store_urls
from tests.support import conveyor


def test_set_list_clear(tmp_path: Path) -> None:
    env = {"CONVEYOR_BROKER_URL": f"sqlite:///{tmp_path}/broker.db"}
    assert "no limits yet" in conveyor("limits", "list", env=env).stdout
    conveyor("limits", "set", "partner-api", "--per-second", "5", env=env)
    conveyor("limits", "set", "tenant:acme", "--max", "1", env=env)
    store = limits.from_url(store_urls(env["CONVEYOR_BROKER_URL"]).limits)
    try:
        spec = [Spec("c", "tenant:acme", max=5)]
        assert store.admit(Parcel("m1", "q", b"{}"), spec, time.time(), 30).granted
        assert store.admit(Parcel("m2", "q", b"{}"), spec, time.time(), 30).verdict == "parked"
    finally:
        store.close()
    text = conveyor("limits", "list", env=env).stdout
    assert "5/s (set)" in text and "max 1 (set)" in text
    rows = {r["key"]: r for r in json.loads(conveyor("limits", "list", "--json",
                                                     env=env).stdout)}
    assert rows["tenant:acme"] == {"key": "tenant:acme", "max": 1, "per_second": None,
                                       "burst": None, "overridden": True, "in_use": 1,
                                       "waiting": 1, "denied": 1}
    assert "cleared" in conveyor("limits", "clear", "tenant:acme", env=env).stdout
    assert "had no" in conveyor("limits", "clear", "tenant:acme", env=env).stdout
    rows = {r["key"]: r for r in json.loads(conveyor("limits", "list", "--json",
                                                     env=env).stdout)}
    assert (rows["tenant:acme"]["max"], rows["tenant:acme"]["overridden"]) == (5, False)
