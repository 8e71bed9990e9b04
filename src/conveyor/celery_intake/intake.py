"""Running the intake beside the supervisor: its threads, supervised, stopped in order.

The worker's supervisor consumes `celery.<queue>` like any other queue, so a Celery-born
task runs in an isolated runner with the same limits, retries, dead letters and metrics.
The intake only moves messages in (the feed), outcomes out (the outcome loop), and Celery's
`revoke` commands to `Client.cancel` (revokes.py), and, when Celery canvases run as
scheduler runs (`canvas_mode`), each run's results to Celery's backend (run_results.py).
If any of its threads dies, it says why
and stops the worker with SIGTERM (a graceful drain): a worker that silently stopped taking
Celery's messages would be worse than one that exits.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import kombu

from conveyor import broker as brokers
from conveyor.celery_intake.canvas import Follower, publish_step
from conveyor.celery_intake.canvas_runs import CanvasRuns
from conveyor.celery_intake.feed import Feed, celery_connection
from conveyor.celery_intake.names import intake_queue, rejects_queue
from conveyor.celery_intake.outcomes import RESULTS_QUEUE, OutcomeLoop
from conveyor.celery_intake.redis_feed import RedisFeed
from conveyor.celery_intake.results import RedisResults
from conveyor.celery_intake.revokes import Revokes
from conveyor.celery_intake.run_results import RunResults, prefix
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.errors import BrokerConnectionError, ConfigError, ConveyorError
from conveyor.locations import REDIS, redact, scheme
from conveyor.message import Codec
from conveyor.scheduler.config import SchedulerConfig
from conveyor.state import store as stores
from conveyor.tasks import REGISTRY, Task

log = logging.getLogger("conveyor.celery_intake")
JOIN_SECONDS = 15.0
CANVAS_MODES = ("auto", "runs", "follow")


def canvas_mode(config: IntakeConfig, settings: Settings) -> str:
    """"runs" or "follow" (see `IntakeConfig.canvas`): auto is runs when the worker was
    given a state store, the scheduler's, and a result backend to write results to."""
    if config.canvas != "auto":
        return config.canvas
    return "runs" if settings.state_url and config.result_backend else "follow"


@dataclass(frozen=True)
class IntakeConfig:
    """What `conveyor worker --celery-queues … --celery-broker … --celery-result-backend …`
    asked for; `broker_url` is Conveyor's own broker."""

    celery_queues: tuple[str, ...]
    celery_broker_url: str
    broker_url: str = ""
    result_backend: str = ""
    prefetch: int = 64
    #: How Celery chains and chords run: "runs" (scheduler runs, as the Python canvas),
    #: "follow" (the intake follows them from results, no scheduler), "auto": runs when a
    #: state store is configured (CONVEYOR_STATE_URL), else follow.
    canvas: str = "auto"

    def __post_init__(self) -> None:
        if not self.celery_broker_url:
            raise ConfigError("--celery-queues needs --celery-broker (CONVEYOR_CELERY_BROKER): "
                              "the broker URL your Celery producers publish to, e.g. "
                              "redis://127.0.0.1:6379/0 or amqp://guest:guest@host//")
        if self.canvas not in CANVAS_MODES:
            raise ConfigError(f"--celery-canvas {self.canvas!r}: one of "
                              f"{', '.join(CANVAS_MODES)}")
        if self.canvas == "runs" and not self.result_backend:
            raise ConfigError("--celery-canvas=runs needs --celery-result-backend "
                              "(CONVEYOR_CELERY_RESULT_BACKEND): each run's results are "
                              "written there, and a chord's members are collected there")

    @property
    def queues(self) -> tuple[str, ...]:
        """The Conveyor queues the worker must consume for these Celery queues."""
        return tuple(intake_queue(q) for q in self.celery_queues)


class Intake:
    """The feed and the outcome loop, started before the supervisor and stopped after it."""

    def __init__(self, config: IntakeConfig, codec: Codec,
                 lookup: Callable[[str], Task[Any, Any] | None] = REGISTRY.get,
                 on_failure: Callable[[], None] | None = None, *,
                 settings: Settings | None = None) -> None:
        """`settings`: where cancel records are kept (the worker's); default: CONVEYOR_*."""
        self.config = config
        self.settings = settings
        self.codec = codec
        self.lookup = lookup
        self.failure: str = ""
        self._on_failure = on_failure or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._feed: Feed | RedisFeed | None = None
        self._outcomes: OutcomeLoop | None = None
        self._revokes: Revokes | None = None
        self._steps: Client | None = None   # publishes the next steps of chains and chords
        self._canvas: CanvasRuns | None = None

    def run(self, main: Callable[[], int]) -> int:
        """Run `main` (the supervisor) with the intake beside it; fail if the intake did."""
        self.start()
        try:
            code = main()
        finally:
            self.stop()
        if self.failure:
            raise ConveyorError(f"worker stopped: the Celery intake failed: {self.failure}")
        return code

    def start(self) -> None:
        c = self.config
        backend = RedisResults(c.result_backend) if c.result_backend else None
        client = Client(brokers.from_url(c.broker_url or None), self.codec,
                        settings=self.settings)
        settings = self.settings or Settings.from_env()
        runs = backend is not None and canvas_mode(c, settings) == "runs"
        kind = RedisFeed if scheme(c.celery_broker_url) in REDIS else Feed
        self._feed = kind(_reachable(c.celery_broker_url), c.celery_queues, client,
                          self.lookup, RESULTS_QUEUE if backend else "", c.prefetch,
                          canvas_runs=runs)
        follower = None
        if backend is not None:   # chains and chords go on from results: canvas.py
            self._steps = Client(brokers.from_url(c.broker_url or None), self.codec,
                                 settings=self.settings)
            follower = Follower(backend, partial(publish_step, self._steps, self.lookup,
                                                 RESULTS_QUEUE))
            if runs:
                self._canvas = self._canvas_runs(backend, self._steps, settings)
        self._outcomes = OutcomeLoop(brokers.from_url(c.broker_url or None),
                                     tuple(rejects_queue(q) for q in c.celery_queues),
                                     backend, self._stop, follower, self._canvas)
        self._revokes = Revokes(celery_connection(c.celery_broker_url), client.cancel,
                                canvas=self._canvas.revoke if self._canvas else None)
        log.info("Celery intake: taking %s from %s into %s; results %s; chains and chords %s",
                 ",".join(c.celery_queues), redact(c.celery_broker_url), ",".join(c.queues),
                 f"to {backend.where} via {RESULTS_QUEUE}" if backend else "not written "
                 "(no --celery-result-backend): outcomes go to Conveyor's events only",
                 f"run as scheduler runs in {redact(settings.stores().state)}" if runs else
                 "followed by this worker (no scheduler runs: give --state, the "
                 "scheduler's CONVEYOR_STATE_URL, or --celery-canvas=runs)")
        threads: list[tuple[str, Callable[[], Any]]] = [
            ("celery-feed", self._feed.run), ("celery-outcomes", self._outcomes.run),
            ("celery-revokes", self._revokes.run)]
        if self._canvas is not None:
            threads.append(("celery-canvas-results", self._canvas.watcher.run))
        for name, target in threads:
            thread = threading.Thread(target=self._guard, args=(name, target), name=name,
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _canvas_runs(self, backend: RedisResults, client: Client,
                     settings: Settings) -> CanvasRuns:
        """What starts Celery canvases as runs in the scheduler's state store, woken on
        its control queue, as `conveyor.scheduler.canvas.start` does for the Python one."""
        config = SchedulerConfig.from_env(broker_url=settings.broker_url or None,
                                          state_url=settings.state_url or None)
        state_url = config.settings.stores().state

        def wake(run_id: str) -> None:
            client.broker.publish(config.control_queue,
                                  json.dumps({"run_id": run_id}).encode())
        watcher = RunResults(backend, partial(stores.from_url, state_url), prefix(state_url),
                             self._stop)
        return CanvasRuns(backend, partial(stores.from_url, state_url), watcher, wake,
                          config.executors, client.cancel)

    def _guard(self, name: str, target: Callable[[], Any]) -> None:
        try:
            target()
        except BaseException as exc:
            if self._stop.is_set():
                log.warning("Celery intake %s ended while stopping: %r", name, exc)
                return
            self.failure = f"{name}: {type(exc).__name__}: {exc}"
            log.error("Celery intake %s died (%s); stopping the worker so a clean one can "
                      "start", name, self.failure, exc_info=exc)
            self._on_failure()
            return
        if not self._stop.is_set():
            self.failure = f"{name} returned unexpectedly"
            self._on_failure()

    def stop(self) -> None:
        """Stop the feed, let the outcome loop write what is ready, close everything."""
        self._stop.set()
        for consumer in (self._feed, self._revokes):
            if consumer is not None:
                consumer.should_stop = True
        if self._outcomes is not None:
            self._outcomes.broker.wakeup()
        for thread in self._threads:
            thread.join(JOIN_SECONDS)
            if thread.is_alive():
                log.warning("Celery intake thread %s did not stop within %.0f s", thread.name,
                            JOIN_SECONDS)
        self._close()

    def _close(self) -> None:
        if self._revokes is not None:
            self._revokes.connection.release()
        if self._feed is not None:
            self._feed.client.close()
            self._feed.connection.release()
        if self._canvas is not None:
            self._canvas.close()
        if self._steps is not None:
            self._steps.close()
        if self._outcomes is not None:
            self._outcomes.broker.close()
            if self._outcomes.backend is not None:
                self._outcomes.backend.close()


def _reachable(url: str) -> kombu.Connection:
    """A connection to Celery's broker, or one readable line at start if there is none."""
    connection = celery_connection(url)
    try:
        connection.ensure_connection(max_retries=2, interval_start=0.5, interval_step=1)
    except Exception as exc:  # kombu raises its own OperationalError or the driver's error
        connection.release()
        raise BrokerConnectionError(f"Celery broker {redact(url)} is unreachable ({exc}): "
                                    "check --celery-broker and that the server is up") from None
    return connection
