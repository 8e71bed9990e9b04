"""`conveyor up`: the whole system in one command and one process tree.

A scheduler and a triggerer (child processes), an autoscaler (this process) and the workers
it starts on demand (its children), on the embedded SQLite files in the data directory
unless given `--broker` and `--state`. With the bundled example DAGs (the default `--dags-
folder`) it creates today's run of each unscheduled one, once a day: starting again resumes
the same run instead of creating another. Your own DAGs run on their schedules and `conveyor
dags trigger`.

Edited, added and removed DAG files are picked up without a restart: `up` looks at the
folder every --dags-reload-interval seconds; when the task modules the DAGs need change, the
workers drain and new ones start with the new `--app` modules, and only then is the
scheduler told to reload (SIGHUP), so no task reaches a worker that cannot import it.

Ctrl-C drains: the scheduler stops, workers finish what they hold (up to --drain-timeout)
and exit, and `up` exits 0 with nothing left running. A second Ctrl-C is a cold stop:
workers kill their tasks and requeue them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from conveyor.autoscaler import daemon as autoscalers
from conveyor.autoscaler.config import AutoscalerConfig, TargetConfig
from conveyor.autoscaler.policy import Rule
from conveyor.autoscaler.targets.local import LocalWorkers
from conveyor.cli import ui
from conveyor.config import Settings, env_flag
from conveyor.errors import ConfigError, ConveyorError
from conveyor.locations import UP_DAGS_FOLDER, data_dir, redact
from conveyor.readers.runs import DONE, recent_runs, run_on, run_tasks
from conveyor.readers.workers import worker_rows
from conveyor.scheduler import examples
from conveyor.scheduler.daemon import importable, task_modules
from conveyor.scheduler.dag import DAG
from conveyor.scheduler.folder import DagFolder
from conveyor.scheduler.runs import create_run
from conveyor.state import store as stores
from conveyor.tasks import REGISTRY
from conveyor.ui.server import Server as UiServer
from conveyor.worker.isolation import die_with_parent

log = logging.getLogger("conveyor.up")
EXAMPLES = Path(examples.__file__).parent / "dags"
#: How often the run printer reads the store (it prints; nothing waits on it).
PRINT_EVERY = 0.5


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("up", help="scheduler, autoscaler and workers in one command, "
                            "on the embedded SQLite files", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    env_flag(p, env="CONVEYOR_BROKER_URL")
    env_flag(p, env="CONVEYOR_STATE_URL")
    env_flag(p, env="CONVEYOR_DAGS_FOLDER")
    env_flag(p, env="CONVEYOR_DAGS_RELOAD_INTERVAL")
    env_flag(p, env="CONVEYOR_QUEUES")
    env_flag(p, env="CONVEYOR_UP_MAX_WORKERS")
    env_flag(p, env="CONVEYOR_CONCURRENCY")
    env_flag(p, env="CONVEYOR_DRAIN_TIMEOUT")
    env_flag(p, env="CONVEYOR_AUTOSCALER_METRICS_PORT")
    env_flag(p, env="CONVEYOR_LOG_LEVEL")
    env_flag(p, env="CONVEYOR_UI_PORT")
    env_flag(p, env="CONVEYOR_UI_HOST")
    p.set_defaults(run=run_up)


@dataclass(frozen=True)
class Plan:
    """Where everything is: what `up` prints first and every process is given."""

    broker_url: str
    state_url: str
    dags_folder: Path
    examples: bool
    queues: tuple[str, ...]
    env: dict[str, str]
    #: the URLs a new shell's commands would not find (given as flags, or in this shell's
    #: environment; they read only their environment and the config file): variable -> URL
    exports: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        settings = Settings.from_env(broker_url=args.broker or None,
                                     state_url=args.state or None)
        data = data_dir()
        data.mkdir(parents=True, exist_ok=True)
        # the example DAG file reads its ledger when loaded, here and in the scheduler
        os.environ.setdefault("CONVEYOR_REVENUE_LEDGER", str(data / "revenue-ledger.txt"))
        folder = Path(args.dags_folder or EXAMPLES).resolve()
        # commands typed in another terminal with this data directory find these DAGs
        (data / UP_DAGS_FOLDER).write_text(f"{folder}\n")
        broker_url, state_url = settings.stores().broker, settings.stores().state
        fresh = Settings.from_env({}).stores()   # what a new shell's commands find
        exports = (("CONVEYOR_BROKER_URL", broker_url, fresh.broker),
                   ("CONVEYOR_STATE_URL", state_url, fresh.state))
        # The children (scheduler, workers) find both URLs in their environment, never in
        # their argv, which every process of the host can read (a URL may hold a password).
        os.environ.update(CONVEYOR_BROKER_URL=broker_url, CONVEYOR_STATE_URL=state_url)
        return cls(broker_url=broker_url, state_url=state_url,
                   dags_folder=folder,
                   examples=not args.dags_folder,
                   queues=tuple(q.strip() for q in args.queues.split(",") if q.strip()),
                   env=dict(os.environ),
                   exports={name: url for name, url, there in exports if url != there})


def run_up(args: argparse.Namespace) -> int:
    plan = Plan.from_args(args)
    folder = DagFolder(plan.dags_folder, ("queue",))
    folder.refresh()
    loaded = folder.loaded()
    for error in loaded.errors:
        log.error("DAG not loaded: %s", error)
    scheduler = _start_scheduler(plan, args.log_level, args.log_format)
    triggerer = _start_triggerer(plan, args.log_level, args.log_format)
    try:
        daemon, server = autoscalers.build(_autoscaler_config(plan, args, loaded.dags))
    except ConveyorError:   # the metrics port is taken, the broker unreachable
        _end(triggerer)
        scheduler.terminate()
        scheduler.wait()
        raise
    try:
        dashboard = _start_dashboard(plan, args)
    except ConfigError:
        if server is not None:
            server.close()
        _end(triggerer)
        scheduler.terminate()
        scheduler.wait()
        raise
    stopper = Stopper(scheduler, daemon)
    stopper.install()
    if args.dags_reload_interval:
        daemon.on_tick = Reloader(folder, args.dags_reload_interval, daemon, scheduler,
                                  lambda apps: _worker_args(plan, args, apps)).tick
    _banner(plan, loaded.dags, server.port if server else 0, scheduler.pid, args.max_workers,
            dashboard)
    if plan.examples:
        _create_todays_runs(plan, loaded.dags)
    printer = RunPrinter(plan.state_url, stopper)
    printer.start()
    try:
        daemon.run()
    finally:
        if server is not None:
            server.close()
        if dashboard is not None:
            dashboard.stop()
        if not stopper.signals:   # a Ctrl-C sent it SIGTERM already: a second one, while it
            stopper.stop_scheduler()   # closes, killed it mid-close ("scheduler exit -15")
        printer.stop()
        _end(triggerer)
    code = scheduler.wait()
    # SIGTERM before its handlers were installed (a Ctrl-C right at start) is a clean stop too
    # (and a cold stop kills it)
    clean = code == 0 or (code == -signal.SIGTERM and stopper.signals > 0) or (
        code == -signal.SIGKILL and stopper.signals > 1)
    print(f"conveyor up: stopped (scheduler exit {code}); nothing is left running", flush=True)
    return 0 if clean and not stopper.failed else 1


def _start_scheduler(plan: Plan, level: str, fmt: str) -> subprocess.Popen[bytes]:
    """The scheduler as a child in its own session: Ctrl-C reaches `up` only, which stops
    it in order; it gets SIGTERM if `up` dies."""
    argv = [sys.executable, "-m", "conveyor.cli", "scheduler", "--executors=queue",
            f"--dags-folder={plan.dags_folder}",
            "--dags-reload-interval=0",                # reloads when `up` says (SIGHUP)
            f"--log-level={level}", f"--log-format={fmt}"]   # URLs: in plan.env
    return subprocess.Popen(argv, env=plan.env, stdin=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=_scheduler_child)


def _start_triggerer(plan: Plan, level: str, fmt: str) -> subprocess.Popen[bytes]:
    """A triggerer (deferred tasks' waits: conveyor/triggerer) as a child, as the scheduler."""
    argv = [sys.executable, "-m", "conveyor.cli", "triggerer", f"--log-level={level}",
            f"--log-format={fmt}"]
    return subprocess.Popen(argv, env=plan.env, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_scheduler_child)


def _end(child: subprocess.Popen[bytes]) -> None:
    """Stop a child that holds no task (the triggerer releases its triggers on SIGTERM)."""
    if child.poll() is None:
        child.terminate()
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _scheduler_child() -> None:
    """Before the scheduler's exec: SIGTERM when `up` dies, and a SIGHUP (reload) ignored
    until the scheduler sets its handler (its default would end the process)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    die_with_parent(signal.SIGTERM)


def _start_dashboard(plan: Plan, args: argparse.Namespace) -> UiServer | None:
    """`conveyor ui` in a thread of this process, over the same store, broker and DAGs."""
    if not args.ui_port:
        return None
    board = ui.dashboard(plan.broker_url, plan.state_url, str(plan.dags_folder), "queue",
                         plan.queues)
    server = ui.bind(board, args.ui_host, args.ui_port, "--ui-port")
    server.start()
    return server


def _autoscaler_config(plan: Plan, args: argparse.Namespace,
                       dags: dict[str, DAG]) -> AutoscalerConfig:
    """One local target: worker processes for the queues, started on demand, down to zero."""
    worker_args = _worker_args(plan, args, task_modules(dags, "queue", "queue"))
    rule = Rule(slots_per_replica=args.concurrency, max_replicas=args.max_workers,
                cooldown=30.0, stabilization_window=10.0)
    target = TargetConfig(name="workers", kind="local", queues=plan.queues, rule=rule,
                          polling_interval=1.0, drain_timeout=args.drain_timeout,
                          worker_args=tuple(worker_args))
    return AutoscalerConfig(broker_url=plan.broker_url, state_url=plan.state_url,
                            metrics_port=args.metrics_port,
                            metrics_addr="127.0.0.1", targets=(target,))


def _worker_args(plan: Plan, args: argparse.Namespace, apps: list[str]) -> list[str]:
    """The flags of `up`'s workers, importing `apps` (the DAGs' task modules)."""
    worker_args = [f"--dags-folder={plan.dags_folder}",   # URLs: in the environment (Plan)
                   "--heartbeat-interval=2",
                   f"--log-level={args.log_level}", f"--log-format={args.log_format}"]
    return worker_args + ([f"--app={','.join(apps)}"] if apps else [])


class Reloader:
    """`up`'s side of hot reload, run at each autoscaler tick: when DAG files changed, the
    workers are replaced if the task modules changed, then the scheduler reloads (SIGHUP)."""

    def __init__(self, folder: DagFolder, interval: float, daemon: autoscalers.Daemon,
                 scheduler: subprocess.Popen[bytes],
                 worker_args: Callable[[list[str]], list[str]]) -> None:
        self.folder = folder
        self.interval = interval
        self.daemon = daemon
        self.scheduler = scheduler
        self.worker_args = worker_args
        self.apps = task_modules(folder.dags, "queue", "queue")
        self.file_tasks = _file_tasks(folder.dags)
        self._next = 0.0

    def tick(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + self.interval
        if not self.folder.refresh():
            return
        apps = task_modules(self.folder.dags, "queue", "queue")
        file_tasks = _file_tasks(self.folder.dags)
        if apps != self.apps or file_tasks != self.file_tasks:
            log.info("conveyor up: the DAGs' task modules are now %s%s: workers drain and new "
                     "ones import them", ",".join(apps) or "none",
                     f" (and the DAG files defining {', '.join(file_tasks)})"
                     if file_tasks else "")
            self.apps, self.file_tasks = apps, file_tasks
            for scaled in self.daemon.scaled:
                if isinstance(scaled.target, LocalWorkers):
                    scaled.target.replace_args(self.worker_args(apps))
                    self.daemon.poke(scaled.config.name)
        if self.scheduler.poll() is None:
            self.scheduler.send_signal(signal.SIGHUP)


def _file_tasks(dags: dict[str, DAG]) -> list[str]:
    """The tasks the DAGs define in their own files (no --app module registers them: the
    workers import the DAG files), with each one's version of its file: a changed file
    means workers that imported the old one are replaced."""
    versions = {node.task: dag.version for dag in dags.values()
                for node in dag.tasks.values() if node.task}
    covered = {name for name in versions if name in REGISTRY
               and importable(REGISTRY[name].fn.__module__)}
    return sorted(f"{name}@{version}" for name, version in versions.items()
                  if name not in covered)


def _banner(plan: Plan, dags: dict[str, DAG], port: int, scheduler_pid: int,
            max_workers: int, dashboard: UiServer | None) -> None:
    board = "off (--ui-port 0)"
    if dashboard is not None:
        board = dashboard.address + ("" if dashboard.dashboard.config.token else
                                     f" (read-only: set {ui.TOKEN_ENV} for actions)")
    lines = [
        "conveyor up",
        f"  broker       {redact(plan.broker_url)}",
        f"  state        {redact(plan.state_url)}",
        f"  DAGs         {plan.dags_folder} ({', '.join(sorted(dags)) or 'none loaded'})",
        f"  scheduler    pid {scheduler_pid}",
        f"  workers      0 to {max_workers} on demand, "
        f"queues {','.join(plan.queues)}; each logs the port of its /metrics",
        f"  autoscaler   {f'http://127.0.0.1:{port}/metrics' if port else 'metrics off'}",
        f"  dashboard    {board}",
        f"  see          {_another_terminal(plan)}conveyor status | conveyor runs list | "
        "conveyor dead-letters list",
        "  stop         Ctrl-C drains; a second Ctrl-C stops at once"]
    print("\n".join(lines), flush=True)


def _another_terminal(plan: Plan) -> str:
    """What another terminal types first: the venv's activate script so that `conveyor` is
    this one (run.sh's venv is not on a new shell's PATH; nothing when `conveyor` on this
    PATH is already ours), and the URLs up was given as flags, which commands there would
    not know (passwords masked: type your own)."""
    steps = []
    bin_dir = Path(sys.executable).parent
    found = shutil.which("conveyor")
    activate = bin_dir / "activate"
    if activate.exists() and not (
            found and Path(found).resolve() == (bin_dir / "conveyor").resolve()):
        steps.append(f". {activate}")
    if plan.exports:
        steps.append("export " + " ".join(f"{name}={shlex.quote(redact(url))}"
                                          for name, url in plan.exports.items()))
    return f"(another terminal: {'; '.join(steps)}) " if steps else ""


def _create_todays_runs(plan: Plan, dags: dict[str, DAG]) -> None:
    """Today's run of each unscheduled example DAG; one per day, so a restart resumes it."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    store = stores.from_url(plan.state_url)
    try:
        for dag in dags.values():
            if dag.schedule:
                continue
            run_id = create_run(store, dag, datetime.now(UTC).timestamp(), executors=["queue"],
                                logical_date=today, run_type="manual")
            if run_id is None:
                row = run_on(store, dag.dag_id, today)
                print(f"run {row['run_id'] if row else '?'} of {dag.dag_id}: today's run "
                      f"exists ({row['state'] if row else '?'}), resuming it", flush=True)
            else:
                print(f"run {run_id} of {dag.dag_id}: created for today", flush=True)
    finally:
        store.close()
    from conveyor.scheduler import daemon as scheduler_daemon
    from conveyor.scheduler.config import SchedulerConfig
    scheduler_daemon.poke(SchedulerConfig(settings=Settings(broker_url=plan.broker_url)),
                          "up")


class Stopper:
    """Ctrl-C handling: the first drains, the second is a cold stop."""

    def __init__(self, scheduler: subprocess.Popen[bytes], daemon: autoscalers.Daemon) -> None:
        self.scheduler = scheduler
        self.daemon = daemon
        self.signals = 0
        self.failed = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1:
            print("\nconveyor up: draining: the scheduler stops, workers finish what they "
                  "hold (Ctrl-C again to stop at once)", flush=True)
            self.stop_scheduler()
            self.daemon.stop()
            return
        print("\nconveyor up: cold stop: tasks are killed and requeued", flush=True)
        for s in self.daemon.scaled:
            for pid in getattr(s.target, "pids", list)():
                _signal(pid, signal.SIGTERM)   # a worker's second signal: cold shutdown
        _signal(self.scheduler.pid, signal.SIGKILL)

    def stop_scheduler(self) -> None:
        if self.scheduler.poll() is None:
            self.scheduler.send_signal(signal.SIGTERM)

    def fail(self, why: str) -> None:
        """A part died on its own: say so and stop everything (fail fast)."""
        log.error("conveyor up: %s; stopping everything", why)
        self.failed = True
        self.daemon.stop()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


class RunPrinter:
    """Prints each run's changes of state (created, running, success, failed) as they
    happen, and watches that the scheduler is alive."""

    def __init__(self, state_url: str, stopper: Stopper) -> None:
        self.state_url = state_url
        self.stopper = stopper
        self.seen: dict[str, str] = {}
        self.draining = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="conveyor-up-runs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        store = stores.from_url(self.state_url)
        try:
            while not self._stop.wait(PRINT_EVERY):
                if self.stopper.scheduler.poll() is not None and not self.stopper.signals:
                    self.stopper.fail(f"the scheduler exited on its own "
                                      f"(code {self.stopper.scheduler.returncode})")
                    return
                self.print_changes(store)
                if self.stopper.signals == 1:
                    self.print_drain(store)
        finally:
            store.close()

    def print_drain(self, store: Any) -> None:
        """While draining: how many tasks the workers still hold (from the registry)."""
        busy = sum(w["busy"] for w in worker_rows(store, time.time()))
        if busy != self.draining:
            self.draining = busy
            print(f"draining: {busy} task(s) still running", flush=True)

    def print_changes(self, store: Any) -> None:
        for run in reversed(recent_runs(store, 20)):
            if self.seen.get(run["run_id"]) == run["state"]:
                continue
            self.seen[run["run_id"]] = run["state"]
            print(f"run {run['run_id']} of {run['dag_id']}: {run['state']}"
                  + _detail(store, run), flush=True)


def _detail(store: Any, run: dict[str, Any]) -> str:
    if run["state"] not in DONE:
        return ""
    tasks = run_tasks(store, run["run_id"])
    retried = [f"{t['task_id']} took {t['attempt']} attempts" for t in tasks if t["attempt"] > 1]
    took = run["ended_at"] - run["started_at"] if run["started_at"] else 0.0
    return (f" in {took:.1f} s" + (f" ({'; '.join(retried)})" if retried else "")
            + f": conveyor runs show {run['run_id']}")
