"""Defining tasks: a decorator that registers a function under a name, with its options.

    @task(queue="heavy", max_retries=3, memory_limit="2GiB", time_limit=600)
    def clean_orders(day: str) -> int: ...

    clean_orders.enqueue("2026-11-23")          # publish through the configured broker
    clean_orders("2026-11-23")                  # still a plain function call

Shell-command workloads need no registration: `Client.enqueue_command([...])`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from conveyor.errors import ConveyorError, UnknownTask
from conveyor.flow import (
    LIMITS_HEADER,
    Limit,
    Rate,
    check_templates,
    check_unique_key,
    encode,
    resolve,
    unique_key_of,
)
from conveyor.kinds import parse_size
from conveyor.message import Message, deadline

if TYPE_CHECKING:
    from conveyor.canvas import Signature
    from conveyor.results.handle import ResultHandle

P = ParamSpec("P")
R = TypeVar("R")


class Retry(ConveyorError):
    """Raise inside a task to ask for a retry, optionally after `delay` seconds."""

    def __init__(self, reason: str = "retry requested", delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Skip(ConveyorError):
    """Raise inside a task to end it `skipped`: not a failure, never retried (Airflow's
    `AirflowSkipException`). In a DAG the trigger rules below it treat it as skipped (an
    `all_success` child is skipped, a `none_failed` one runs); a task enqueued on its own
    is recorded `skipped` and its `handle.result()` is None."""

    def __init__(self, reason: str = "skipped by the task") -> None:
        super().__init__(reason)


class Defer(ConveyorError):
    """Raise inside a DAG task to wait without a worker slot (Airflow's deferral): the
    runner exits, a `conveyor triggerer` runs `trigger` (conveyor.triggers: a time, a
    delay, a file, an HTTP endpoint, a SQL query, or one's own), and when it fires the task
    runs again, the same attempt, with the trigger's payload in `context.trigger_event`.
    Not fired within `timeout` seconds (None: no limit), the attempt fails `timed_out`
    (retried while attempts remain, like any timeout). A task enqueued outside a DAG has
    no scheduler to resume it: it fails, saying so."""

    def __init__(self, trigger: Any, timeout: float | None = None) -> None:
        super().__init__(f"deferred on {type(trigger).__name__}")
        self.trigger = trigger
        self.timeout = timeout


class SoftTimeLimitExceeded(ConveyorError):
    """Raised inside a task when its soft time limit passes; clean up and return or raise."""


@dataclass(frozen=True)
class TaskOptions:
    """Per-task policy. Zero limits mean "use the worker's default"."""

    name: str
    queue: str = "default"
    max_retries: int = 3
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0
    time_limit: float = 0.0
    soft_time_limit: float = 0.0
    memory_limit: int = 0
    priority: int = 0
    store_result: bool = True
    limits: tuple[Limit | Rate, ...] = ()
    unique_key: str | Callable[..., Any] | None = None
    unique_for: float = 0.0
    #: Seconds from enqueue by which a run must have started, else it is dead-lettered
    #: `expired` unrun (0: never).
    expires: float = 0.0


#: Keyword arguments `Task.enqueue` takes for itself, never passed to the function.
ENQUEUE_OPTIONS = ("unique_key", "unique_for", "expires")


@dataclass(frozen=True)
class Task(Generic[P, R]):
    fn: Callable[P, R]
    options: TaskOptions
    _client: list[Any] = field(default_factory=list, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.options.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def message(self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                **fields: Any) -> Message:
        """The message that runs this task with these arguments and the task's options."""
        o = self.options
        base = Message(queue=o.queue, task=o.name, args=tuple(args), kwargs=dict(kwargs or {}),
                       priority=o.priority, time_limit=o.time_limit,
                       soft_time_limit=o.soft_time_limit, memory_limit=o.memory_limit,
                       max_retries=o.max_retries)
        if o.limits:
            specs = resolve(self.fn, o.limits, args, kwargs or {})
            base = replace(base, headers={LIMITS_HEADER: encode(specs)})
        if "headers" in fields and base.headers:
            fields["headers"] = {**base.headers, **fields["headers"]}
        return replace(base, **fields)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this task for the canvas (`chain`, `group`, `chord`): in a chain
        it is given the previous step's result before `args`."""
        from conveyor.canvas import Signature
        return Signature(self.name, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: in a chain it does not take the previous result."""
        from conveyor.canvas import Signature
        return Signature(self.name, args, kwargs, immutable=True)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> ResultHandle:
        """Publish a run of this task through the default client (CONVEYOR_* settings);
        `handle.result()` waits for its value unless the task has `store_result=False`.

        `unique_key=`, `unique_for=` and `expires=` are taken here, not passed to the
        function: once per key (see `Client.enqueue`; the task's own `unique_key` applies
        when not given) and the deadline to start (see `enqueue_with`)."""
        options = {k: kwargs.pop(k) for k in ENQUEUE_OPTIONS if k in kwargs}
        return self.enqueue_with(args, kwargs, **options)  # type: ignore[arg-type]

    def enqueue_with(self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                     *, delay: float = 0.0, unique_key: str | None = None,
                     unique_for: float | None = None, expires: float | datetime | None = None,
                     **fields: Any) -> ResultHandle:
        """Publish with message fields overridden (queue, reply_to, run_id, priority...).

        `expires`: seconds from now, or a datetime, by which it must have started (the
        task's own `expires` when not given); a worker that takes it later dead-letters it
        unrun with reason `expired` (README "Expiry")."""
        from conveyor.client import default_client
        o = self.options
        key = unique_key if unique_key is not None else (
            unique_key_of(self.fn, o.unique_key, args, kwargs or {}) if o.unique_key else "")
        message = self.message(args, kwargs, **fields)
        expires = o.expires or None if expires is None else expires
        if expires is not None:
            message = replace(message, expires=deadline(expires, message.enqueued_at, delay))
        return default_client().enqueue(
            message, delay=delay, keep_result=o.store_result,
            unique_key=key, unique_for=o.unique_for if unique_for is None else unique_for)


REGISTRY: dict[str, Task[Any, Any]] = {}


@overload
def task(fn: Callable[P, R], *, name: str | None = None, queue: str = "default",
         max_retries: int = 3, retry_backoff: float = 1.0, retry_backoff_max: float = 300.0,
         time_limit: float = 0.0, soft_time_limit: float = 0.0, memory_limit: int | str = 0,
         priority: int = 0, store_result: bool = True,
         concurrency: Limit | Sequence[Limit] = (), rate: Rate | Sequence[Rate] = (),
         unique_key: str | Callable[..., Any] | None = None, unique_for: float = 0.0,
         expires: float = 0.0) -> Task[P, R]: ...


@overload
def task(fn: None = None, *, name: str | None = None, queue: str = "default",
         max_retries: int = 3, retry_backoff: float = 1.0, retry_backoff_max: float = 300.0,
         time_limit: float = 0.0, soft_time_limit: float = 0.0, memory_limit: int | str = 0,
         priority: int = 0, store_result: bool = True,
         concurrency: Limit | Sequence[Limit] = (), rate: Rate | Sequence[Rate] = (),
         unique_key: str | Callable[..., Any] | None = None, unique_for: float = 0.0,
         expires: float = 0.0) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(fn: Callable[P, R] | None = None, *, name: str | None = None, queue: str = "default",
         max_retries: int = 3, retry_backoff: float = 1.0, retry_backoff_max: float = 300.0,
         time_limit: float = 0.0, soft_time_limit: float = 0.0, memory_limit: int | str = 0,
         priority: int = 0, store_result: bool = True,
         concurrency: Limit | Sequence[Limit] = (), rate: Rate | Sequence[Rate] = (),
         unique_key: str | Callable[..., Any] | None = None, unique_for: float = 0.0,
         expires: float = 0.0) -> Any:
    """Register `fn` as a task (usable bare, `@task`, or with options, `@task(queue=...)`).

    `store_result=False`: nobody will ask for the value, so the worker never writes it.
    `concurrency=Limit(key="tenant:{tenant_id}", max=2)` and `rate=Rate(key="api",
    per_second=10)`: flow control across every worker (see `conveyor.flow`); a key template
    naming an argument the function does not have is an error here, at decoration.
    `unique_key="invoice:{invoice_id}"` (or a function of the task's arguments) and
    `unique_for=600`: every enqueue is once per key unless it names its own (README "Once
    per key"). `expires=300`: each run must start within 300 s of its enqueue, else it is
    dead-lettered `expired` unrun, unless the enqueue names its own (README "Expiry").
    """
    limits: tuple[Limit | Rate, ...] = (
        *((concurrency,) if isinstance(concurrency, Limit) else tuple(concurrency)),
        *((rate,) if isinstance(rate, Rate) else tuple(rate)))

    def register(f: Callable[P, R]) -> Task[P, R]:
        options = TaskOptions(
            name=name or f"{f.__module__}.{f.__qualname__}", queue=queue,
            max_retries=max_retries, retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max, time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            memory_limit=parse_size(memory_limit, "memory_limit"), priority=priority,
            store_result=store_result, limits=limits, unique_key=unique_key,
            unique_for=unique_for, expires=expires)
        check_templates(f, limits)
        check_unique_key(f, unique_key)
        registered: Task[P, R] = Task(f, options)
        REGISTRY[options.name] = registered
        return registered

    return register(fn) if fn is not None else register


def lookup(name: str) -> Task[Any, Any]:
    """The registered task called `name`, or UnknownTask naming what is registered."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY)[:20]) or "none"
        raise UnknownTask(f"no task named {name!r} is registered in this worker (known: "
                          f"{known}); is its module passed with --app?") from None


#: Functions `worker_process_init` registered, in order; every runner calls them once.
PROCESS_INIT: list[Callable[[], None]] = []


def worker_process_init(fn: Callable[[], None]) -> Callable[[], None]:
    """Register `fn` to run once in every runner process, before its first task arrives.

    Runners are forked ahead of need and wait idle for a task; `fn` runs in that wait (as
    Celery's `worker_process_init` signal does), so what every task of the process needs
    (a database or Redis connection, a client object) is ready when the task starts and
    its set-up is off the task's latency. It runs in the runner itself: after the uid/gid
    drop, non-dumpable, with the scrubbed environment, so whatever it opens belongs to that
    one process, and with a fresh runner per task (the default) to that one task. Keep it
    light: it runs in the lane of a slot that may be running another task, and what it
    allocates counts towards that slot's memory cap. If it raises, the runner's task fails
    with a reason naming the hook and the error (retried like any failure).
    """
    PROCESS_INIT.append(fn)
    return fn
