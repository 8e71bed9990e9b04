"""Every setting Conveyor has, one row each: its variable, file key, flags, default, kind and
help. `config` reads them (environment, then conveyor.toml, then the default; flags first on
the commands that take one) and `conveyor config show` lists them; the README's
configuration reference is generated from them.

A command takes a row's flag with `config.env_flag(parser, env=...)`; where commands spell
a setting differently (`ui --port` is `up --ui-port`), the row says how (`Variant`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor import kinds
from conveyor.locations import DAGS
from conveyor.logs import log_format
from conveyor.message import DEFAULT_MAX_BYTES
from conveyor.tracing import mode as tracing_mode

FILE_VARIABLE = "CONVEYOR_CONFIG_FILE"


@dataclass(frozen=True)
class Variant:
    """How one command's flag for a setting differs from the row (None: as the row has it)."""

    help: str | None = None
    default: Any = None
    kind: Callable[[str], Any] | None = None
    flags: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Setting:
    """A row of the table: a setting read the same way wherever it is read. A command takes
    its flag with `env_flag(parser, env=...)`, which finds the flags, default, kind and help
    here; commands' own flags that have no row add theirs to the catalog as they register."""

    env: str
    help: str
    default: Any = ""
    kind: Callable[[str], Any] = str
    #: the commands that read it without a flag ((): all of them, or those with its flag)
    commands: tuple[str, ...] = ()
    #: False: the environment only (the data directory and the file's own location)
    in_file: bool = True
    #: its flags, on every command that takes one
    flags: tuple[str, ...] = ()
    #: what --help says of the flag ("": `help`)
    flag_help: str = ""
    #: command (its words after `conveyor`, or the first) -> how its flag differs
    variants: Mapping[str, Variant] = field(default_factory=dict)
    #: False: checked by the commands that take its flag, not at every command's start (a
    #: wrong CONVEYOR_QUEUES must not stop `conveyor status`)
    checked_everywhere: bool = True

    def spelled(self, command: str) -> tuple[tuple[str, ...], Any, Callable[[str], Any], str]:
        """(flags, default, kind, help) of this setting's flag on `command`."""
        variant = self.variants.get(command) or self.variants.get(command.split(" ")[0])
        variant = variant or Variant()
        return (self.flags if variant.flags is None else variant.flags,
                self.default if variant.default is None else variant.default,
                variant.kind or self.kind,
                variant.help or self.flag_help or self.help)


def flagged(env: str, help: str, default: Any = "", kind: Callable[[str], Any] = str,
            **more: Any) -> Setting:
    """A row checked only by the commands that take its flag, not at every command's start
    (every row of FLAGS but the dashboard's token, which has no flag)."""
    return Setting(env, help, default, kind, checked_everywhere=False, **more)


#: What the scheduler's own defaults are (`SchedulerConfig`'s; a test keeps them equal).
SCHEDULER = ("scheduler",)

TABLE = (
    Setting("CONVEYOR_BROKER_URL", "broker URL: sqlite:///…, redis://…, "
            "redis+sentinel://…, amqp://…, postgresql://…, kombu+<transport>://… (default: "
            "the embedded SQLite file)",
            kind=kinds.url, flags=("-b", "--broker"),
            flag_help="broker URL (default: the embedded SQLite file)",
            variants={"autoscaler": Variant("broker URL (default: the file's broker_url, else "
                                            "the embedded SQLite file)")}),
    Setting("CONVEYOR_STATE_URL", "scheduler state store URL: sqlite:///… or postgresql://… "
            "(default: scheduler.db in the data directory)", kind=kinds.url, flags=("--state",),
            flag_help="state store URL, sqlite:///… or postgresql://… (default: embedded "
                      "SQLite)",
            variants={"worker": Variant("state store the worker registers in, for `conveyor "
                                        "status` (default: the embedded one when the broker "
                                        "is too, else none)"),
                      "autoscaler": Variant("state store where decisions are recorded for "
                                            "the dashboard (default: the file's state_url; "
                                            "with no broker given either, the embedded SQLite "
                                            "file)"),
                      "up": Variant("state store URL (default: the embedded SQLite file)")}),
    Setting("CONVEYOR_SIGNING_KEY", "HMAC key: messages are signed, and unsigned ones "
            "dead-lettered"),
    Setting("CONVEYOR_MAX_MESSAGE_BYTES", "largest message accepted; bigger ones are "
            "dead-lettered", DEFAULT_MAX_BYTES, kinds.size),
    Setting("CONVEYOR_RESULT_URL", "where task results are kept: redis://…, "
            "redis+sentinel://…, sqlite:///… or postgresql://… (default: the broker's Redis, "
            "else the state store)", kind=kinds.url),
    Setting("CONVEYOR_RESULT_TTL", "seconds a stored task result is kept", 86400.0,
            kinds.positive_seconds),
    Setting("CONVEYOR_RESULT_MAX_BYTES", "largest task result stored; a task returning more "
            "fails", DEFAULT_MAX_BYTES, kinds.size),
    Setting("CONVEYOR_LIMITS_URL", "where flow-control limits are kept: redis://…, "
            "redis+sentinel://…, sqlite:///… or postgresql://… (default: the broker unless it "
            "is RabbitMQ or kombu, then the state store)", kind=kinds.url, flags=("--limits-url",),
            flag_help="where limits are kept (default: the broker unless it is RabbitMQ or "
                      "kombu, then the state store)"),
    Setting("CONVEYOR_TRACING", "OpenTelemetry traces (needs conveyor[otel]): off, console, "
            "otlp (to OTEL_EXPORTER_OTLP_ENDPOINT), or module:callable returning an exporter",
            "off", tracing_mode),
    Setting("CONVEYOR_EVENTS_QUEUE", "queue the workers send DAG tasks' events to, and the "
            "scheduler reads", "conveyor.scheduler.events", commands=SCHEDULER),
    Setting("CONVEYOR_SCHEDULER_CONTROL_QUEUE", "queue that tells the scheduler to look at a "
            "run now (submit, trigger, the dashboard)", "conveyor.scheduler.control",
            commands=SCHEDULER),
    Setting("CONVEYOR_SCHEDULER_EVENT_LEASE", "seconds a claimed event, and the scheduler's "
            "own lease, stay its own: a killed scheduler's work goes to another this soon",
            5.0, kinds.positive_seconds, SCHEDULER),
    Setting("CONVEYOR_SCHEDULER_START_GRACE", "seconds past a DAG attempt's start deadline "
            "before it is timed out (clock skew, a late `started` event)", 5.0, kinds.seconds,
            SCHEDULER),
    Setting("CONVEYOR_MAX_MAP_LENGTH", "most instances one mapped DAG task (`expand`) may "
            "create; a longer list fails the task (a task's own max_map_length wins)", 1024,
            kinds.positive_int, SCHEDULER),
    Setting("CONVEYOR_DAG_IMPORT_TIMEOUT", "seconds one DAG file may take to import before it "
            "is stopped (0: no limit)", 30.0, kinds.seconds, SCHEDULER),
    Setting("CONVEYOR_HOME", "data directory of the embedded files (broker, state store, "
            "conveyor.toml) (default: $XDG_DATA_HOME/conveyor, else "
            "~/.local/share/conveyor)", in_file=False),
    Setting(FILE_VARIABLE, "the TOML file of settings (default: ./conveyor.toml, else "
            "conveyor.toml in the data directory)", in_file=False),
)
#: The DAGs folder's row, and the worker's flag (the others' say less).
WORKER_DAGS_FOLDER = ("folder of DAG files whose tasks this worker runs too, the ones a DAG "
                      "file defines itself (default: ./dags when it exists, else the folder "
                      "`conveyor up` runs with this data directory; '': none)")
#: The settings several commands take a flag for, each spelled here once.
FLAGS = (
    flagged("CONVEYOR_LOG_LEVEL", "log level", "INFO", kinds.log_level, flags=("--log-level",),
            variants={"ui": Variant("log level (DEBUG logs every request)")}),
    flagged("CONVEYOR_LOG_FORMAT", "log lines for people (human) or one JSON object each "
            "(json)", "human", log_format, flags=("--log-format",)),
    flagged("CONVEYOR_EXECUTORS", "comma-separated executors, the first the default: queue, "
            "local, kubernetes", "queue", flags=("--executors",),
            variants={"ui": Variant("comma-separated executors the DAGs may name")}),
    flagged("CONVEYOR_DAGS_FOLDER", WORKER_DAGS_FOLDER, DAGS,
            flags=("--dags-folder",),
            flag_help="folder of DAG files (default: ./dags, else the folder `conveyor up` "
                      "runs with this data directory)",
            variants={"worker": Variant(WORKER_DAGS_FOLDER),
                      "ui": Variant("folder of DAG files (for the DAGs page, trigger and "
                                    "pause)"),
                      "up": Variant("folder of DAG files (default: the bundled examples, "
                                    "revenue among them)", default="")}),
    flagged("CONVEYOR_DAGS_RELOAD_INTERVAL", "seconds between looks at the DAGs folder: added, "
            "changed and removed files are loaded again without a restart (0: only on "
            "SIGHUP)", 5.0, kinds.seconds, flags=("--dags-reload-interval",),
            variants={"up": Variant("seconds between looks at the DAGs folder for changed "
                                    "files (0: never)")}),
    flagged("CONVEYOR_CONCURRENCY", "runner slots (tasks at once)", os.cpu_count() or 2,
            kinds.positive_int, flags=("-c", "--concurrency"),
            variants={"up": Variant("runner slots per worker")}),
    flagged("CONVEYOR_QUEUES", "comma-separated queues, first listed first", ("default",),
            kinds.queue_names, flags=("-Q", "--queues"),
            variants={"up": Variant("comma-separated queues the workers serve", "default",
                                    str)}),
    flagged("CONVEYOR_DRAIN_TIMEOUT", "seconds running tasks get to finish after SIGTERM; "
            "match Kubernetes' terminationGracePeriodSeconds", 30.0, kinds.seconds,
            flags=("--drain-timeout",),
            variants={"up": Variant("seconds running tasks get to finish after Ctrl-C",
                                    10.0)}),
    flagged("CONVEYOR_UI_HOST", "address to listen on (0.0.0.0: every interface; put TLS in "
            "front)", "127.0.0.1", flags=("--host",),
            variants={"up": Variant("the dashboard's address", flags=("--ui-host",))}),
    # 8700: Airflow's 8080 and Flower's 5555 are often taken
    flagged("CONVEYOR_UI_PORT", "port to listen on (0: any free one, printed)", 8700, kinds.port,
            flags=("--port",),
            variants={"up": Variant("the dashboard's port (0: no dashboard)",
                                    flags=("--ui-port",))}),
    Setting("CONVEYOR_UI_TOKEN", "token that dashboard actions (task retry/clear/mark/cancel, "
            "run cancel, requeue, purge, trigger, pause, limits) need; unset: the dashboard is "
            "read-only",
            commands=("ui", "up")),
    flagged("CONVEYOR_AUTOSCALER_METRICS_PORT", "port of /metrics and /api/v1/queues/<queue> "
            "(default: the file's metrics_port, else 9400; 0: off)", None, kinds.port,
            flags=("--metrics-port",),
            variants={"up": Variant("the autoscaler's /metrics and queue-depth API (0: off)",
                                    9400)}),
    # the flags of one command
    flagged("CONVEYOR_APP", "comma-separated modules that register tasks (imported once, before "
            "forking)", (), kinds.names,
            flags=("-A", "--app")),
    flagged("CONVEYOR_MEMORY_LIMIT", "hard memory cap of each runner (bytes, or a unit: "
            "2GiB; 0: no cap); a task's own memory_limit wins", 0, kinds.size,
            flags=("--memory-limit",)),
    flagged("CONVEYOR_MAX_TASKS_PER_CHILD", "tasks a runner runs before it is replaced (1: fresh "
            "runner per task, the safe default)", 1, kinds.positive_int,
            flags=("--max-tasks-per-child",)),
    flagged("CONVEYOR_READ_AHEAD", "deliveries a broker that pushes (RabbitMQ) may send beyond the "
            "free slots, so the next tasks are here when a slot frees; each waits behind this "
            "worker's running tasks while another worker may be idle, and its wait counts toward "
            "RabbitMQ's consumer timeout: 0 for tasks of seconds or more (Celery's -O fair); on "
            "Postgres a worker that claimed more than its slots in the last 50 ms (short tasks) "
            "claims that many more at once; Redis and SQLite claim only for a free slot", 8,
            kinds.non_negative_int,
            flags=("--read-ahead",)),
    flagged("CONVEYOR_TIME_LIMIT", "hard time limit in seconds: the runner is killed (0: none)",
            0.0, kinds.seconds, flags=("--time-limit",)),
    flagged("CONVEYOR_SOFT_TIME_LIMIT", "soft time limit in seconds: SoftTimeLimitExceeded is "
            "raised in the task", 0.0, kinds.seconds,
            flags=("--soft-time-limit",)),
    flagged("CONVEYOR_CANCEL_GRACE", "seconds a cancelled running task gets to clean up "
            "(Cancelled is raised in it) before it is killed", 10.0, kinds.seconds,
            flags=("--cancel-grace",)),
    flagged("CONVEYOR_UID", "run tasks as this user (name or number; the worker must be root); its "
            "primary group unless --gid is given", None, str,
            flags=("--uid",)),
    flagged("CONVEYOR_GID", "run tasks as this group (name or number)", None, str,
            flags=("--gid",)),
    flagged("CONVEYOR_HOSTNAME", "name of this worker in events and logs",
            socket.gethostname(), str, flags=("-n", "--hostname")),
    flagged("CONVEYOR_CODE_VERSION", "the version of the tasks' code this worker announces "
            "and serves <queue>@<version> for (runs pinned to their code send their later "
            "tasks to workers of the version they started on; default: derived from the "
            "app, its git revision or a hash of its source; none: announce none)", "",
            kinds.code_version, flags=("--code-version",)),
    flagged("CONVEYOR_HEARTBEAT_INTERVAL", "seconds between heartbeats (lease renewals, events)",
            10.0, kinds.positive_seconds, flags=("--heartbeat-interval",)),
    flagged("CONVEYOR_LEASE", "seconds a delivery stays this worker's without a renewal "
            "(Redis, Postgres, SQLite): a worker that cannot renew for this long stops the task "
            "itself before another worker runs it (self-fencing); longer rides out a longer "
            "broker outage, shorter hands a cut-off worker's task on sooner (0: three heartbeat "
            "intervals, at least 3 s)", 0.0, kinds.seconds, flags=("--lease",)),
    flagged("CONVEYOR_BURST", "drain the queues, then exit", False, bool,
            flags=("--burst",)),
    flagged("CONVEYOR_METRICS_PORT", "serve Prometheus /metrics on this port (0: off)",
            0, kinds.port, flags=("--metrics-port",)),
    flagged("CONVEYOR_MAX_DELIVERIES", "deliveries without an outcome (crashes, shutdowns) "
            "before a message is dead-lettered", 20, kinds.positive_int,
            flags=("--max-deliveries",)),
    flagged("CONVEYOR_EXIT_AFTER_OUTAGE", "stop the worker when the broker has been unreachable "
            "this many seconds with outcomes waiting to be settled (0: never; ride out any outage)",
            0.0, kinds.seconds, flags=("--exit-after-outage",)),
    flagged("CONVEYOR_CELERY_QUEUES", "comma-separated Celery queues to take tasks from (Celery "
            "task protocol 2, JSON); they run as the tasks registered under the same names",
            (), kinds.names, flags=("--celery-queues",)),
    flagged("CONVEYOR_CELERY_BROKER", "the broker URL the Celery producers publish to (kombu URL)",
            "", kinds.url, flags=("--celery-broker",)),
    flagged("CONVEYOR_CELERY_RESULT_BACKEND", "Celery's Redis result backend: results are written "
            "there in Celery's format (default: Conveyor events only)", "", kinds.url,
            flags=("--celery-result-backend",)),
    flagged("CONVEYOR_CELERY_CANVAS", "how Celery chains and chords run: runs (scheduler runs, "
            "in `runs list` and the dashboard; needs a scheduler on the state store), follow "
            "(this worker follows them, no scheduler), auto (runs when --state is given)",
            "auto", kinds.celery_canvas, flags=("--celery-canvas",)),
    flagged("CONVEYOR_TRIGGERER_LEASE", "seconds a triggerer's claim on a trigger lasts: a killed "
            "triggerer's triggers are run by another this soon", 10.0, kinds.positive_seconds,
            flags=("--lease",)),
    flagged("CONVEYOR_TRIGGERER_POLL", "seconds between a triggerer's looks for new deferred "
            "tasks", 1.0, kinds.positive_seconds, flags=("--poll",)),
    flagged("CONVEYOR_TRIGGERER_CAPACITY", "most triggers one triggerer runs at once", 10000,
            kinds.positive_int, flags=("--capacity",)),
    flagged("CONVEYOR_SCHEDULER_BURST", "exit when no run is queued or running", False, bool,
            flags=("--burst",)),
    flagged("CONVEYOR_LOCAL_SLOTS", "tasks the local executor runs at once", 4, kinds.positive_int,
            flags=("--local-slots",)),
    flagged("CONVEYOR_KUBERNETES_NAMESPACE", "namespace of task pods", "default", str,
            flags=("--kubernetes-namespace",)),
    flagged("CONVEYOR_KUBERNETES_IMAGE", "default image of task pods (a task's executor_config may "
            "name another)", "", str,
            flags=("--kubernetes-image",)),
    flagged("CONVEYOR_KUBERNETES_PENDING_TIMEOUT", "seconds a pod may stay Pending before it fails",
            300.0, kinds.positive_seconds, flags=("--kubernetes-pending-timeout",)),
    flagged("CONVEYOR_QUEUE_SAMPLE_INTERVAL", "seconds between samples of queue depth, kept a few "
            "hours for the dashboard's chart (0: none)", 15.0, kinds.seconds,
            flags=("--queue-sample-interval",)),
    flagged("CONVEYOR_SCHEDULER_METRICS_PORT", "serve Prometheus /metrics on this port (0: off)",
            0, kinds.port, flags=("--metrics-port",)),
    flagged("CONVEYOR_UP_MAX_WORKERS", "most worker processes the autoscaler starts",
            2, kinds.positive_int, flags=("--max-workers",)),
    flagged("CONVEYOR_AUTOSCALER_CONFIG", "TOML file of targets (see below)",
            "autoscaler.toml", str, flags=("-f", "--config")),
)
ROWS = {row.env: row for row in (*TABLE, *FLAGS)}
