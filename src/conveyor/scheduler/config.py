"""The scheduler's settings: one frozen dataclass, read from `CONVEYOR_*` in one place.

Precedence, as everywhere in Conveyor: flags > environment > defaults. The CLI passes its
flags as overrides; nothing reads the environment at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from conveyor.config import Settings, read
from conveyor.errors import ConfigError
from conveyor.locations import DAGS, dags_folder
from conveyor.scheduler.engine import EVENTS_QUEUE, LEASE, START_GRACE
from conveyor.scheduler.loader import IMPORT_TIMEOUT
from conveyor.scheduler.mapping import MAX_MAP_LENGTH
from conveyor.scheduler.sampler import DEFAULT_INTERVAL
from conveyor.settings_table import ROWS

EXECUTORS = ("queue", "local", "kubernetes")
CONTROL_QUEUE = "conveyor.scheduler.control"
#: Default seconds between looks at the DAGs folder (Airflow's file processor: 30).
RELOAD_INTERVAL: float = ROWS["CONVEYOR_DAGS_RELOAD_INTERVAL"].default
#: setting -> the environment variable that sets it
ENV_VARS = {"dags_folder": "CONVEYOR_DAGS_FOLDER", "executors": "CONVEYOR_EXECUTORS",
            "events_queue": "CONVEYOR_EVENTS_QUEUE",
            "control_queue": "CONVEYOR_SCHEDULER_CONTROL_QUEUE",
            "event_lease": "CONVEYOR_SCHEDULER_EVENT_LEASE",
            "start_grace": "CONVEYOR_SCHEDULER_START_GRACE",
            "max_map_length": "CONVEYOR_MAX_MAP_LENGTH",
            "dag_import_timeout": "CONVEYOR_DAG_IMPORT_TIMEOUT",
            "dags_reload_interval": "CONVEYOR_DAGS_RELOAD_INTERVAL",
            "local_slots": "CONVEYOR_LOCAL_SLOTS",
            "queue_sample_interval": "CONVEYOR_QUEUE_SAMPLE_INTERVAL",
            "kubernetes_namespace": "CONVEYOR_KUBERNETES_NAMESPACE",
            "kubernetes_image": "CONVEYOR_KUBERNETES_IMAGE",
            "kubernetes_pending_timeout": "CONVEYOR_KUBERNETES_PENDING_TIMEOUT"}


@dataclass(frozen=True)
class SchedulerConfig:
    """What `conveyor scheduler` and the `dags`/`runs`/`submit` commands need."""

    settings: Settings = field(default_factory=Settings)   # broker, state store, signing
    dags_folder: str = DAGS
    executors: tuple[str, ...] = ("queue",)
    events_queue: str = EVENTS_QUEUE
    control_queue: str = CONTROL_QUEUE
    #: Seconds a claimed event stays ours, and the scheduler's own lease in the state store:
    #: renewed while we live, so a killed scheduler's claimed events, and the attempts it
    #: claimed and never published, go to another one this soon (the broker default is 60 s).
    event_lease: float = LEASE
    #: Seconds past a DAG attempt's deadline to start (`queued_timeout` after its publish,
    #: stamped on its message as `expires`) before the attempt is timed out: clock skew
    #: between the hosts plus the time a `started` event takes to arrive.
    start_grace: float = START_GRACE
    #: Most instances a mapped task may create (a task's own max_map_length wins).
    max_map_length: int = MAX_MAP_LENGTH
    #: Seconds one DAG file may take to import before it is stopped (0: no limit).
    dag_import_timeout: float = IMPORT_TIMEOUT
    #: Seconds between looks at the DAGs folder for added, changed or removed files (a stat
    #: of each file; only those that changed are loaded again). 0: only on SIGHUP.
    dags_reload_interval: float = RELOAD_INTERVAL
    local_slots: int = 4
    kubernetes_namespace: str = "default"
    kubernetes_image: str = ""
    kubernetes_pending_timeout: float = 300.0
    #: Seconds between samples of queue depth for the dashboard's chart (0: none).
    queue_sample_interval: float = DEFAULT_INTERVAL

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, broker_url: str | None = None,
                 state_url: str | None = None, **overrides: Any) -> SchedulerConfig:
        """Overrides (flags) > environment > file > defaults; the shared keys go through
        `Settings`. With an explicit `env` mapping, only it counts (no file)."""
        values: dict[str, Any] = {name: read(var, env) for name, var in ENV_VARS.items()}
        values.update({k: v for k, v in overrides.items() if v is not None})
        values = {k: v for k, v in values.items() if v is not None}
        values["dags_folder"] = dags_folder(values.get("dags_folder") or DAGS)
        settings = Settings.from_env(env, broker_url=broker_url, state_url=state_url)
        return replace(cls(settings=settings), **_typed(values)).checked()

    def checked(self) -> SchedulerConfig:
        unknown = [e for e in self.executors if e not in EXECUTORS]
        if not self.executors or unknown:
            raise ConfigError(f"executors {','.join(self.executors)!r}: each must be one of "
                              f"{', '.join(EXECUTORS)} (the first is the default)")
        if not 0 <= self.dags_reload_interval < float("inf"):
            raise ConfigError(f"CONVEYOR_DAGS_RELOAD_INTERVAL={self.dags_reload_interval!r} is "
                              "not a number of seconds, 0 or more (0: reload DAGs on SIGHUP only)")
        if not 0 < self.event_lease < float("inf"):
            raise ConfigError(f"CONVEYOR_SCHEDULER_EVENT_LEASE={self.event_lease!r} is not a "
                              "number of seconds above 0")
        if not 0 <= self.start_grace < float("inf"):
            raise ConfigError(f"CONVEYOR_SCHEDULER_START_GRACE={self.start_grace!r} is not a "
                              "number of seconds, 0 or more")
        if not isinstance(self.max_map_length, int) or self.max_map_length < 1:
            raise ConfigError(f"CONVEYOR_MAX_MAP_LENGTH={self.max_map_length!r} is not a whole "
                              "number of at least 1")
        if "kubernetes" in self.executors and not self.kubernetes_image:
            raise ConfigError("the kubernetes executor needs an image: set "
                              "--kubernetes-image (CONVEYOR_KUBERNETES_IMAGE)")
        return self


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """Strings from the environment or flags, converted to each field's type."""
    out = dict(values)
    if isinstance(out.get("executors"), str):
        out["executors"] = tuple(e.strip() for e in out["executors"].split(",") if e.strip())
    for name, kind in (("event_lease", float), ("start_grace", float),
                       ("dag_import_timeout", float), ("dags_reload_interval", float),
                       ("local_slots", int), ("max_map_length", int),
                       ("kubernetes_pending_timeout", float), ("queue_sample_interval", float)):
        if isinstance(out.get(name), str):
            try:
                out[name] = kind(out[name])
            except ValueError:
                wanted = "an integer" if kind is int else "a number"
                raise ConfigError(f"{ENV_VARS.get(name, name)}={out[name]!r} is not "
                                  f"{wanted}") from None
    return out
