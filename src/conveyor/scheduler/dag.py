"""DAGs: tasks, the order between them, and how each one runs, declared in plain Python.

    from conveyor.scheduler import DAG
    from billing.tasks import extract_orders, clean_orders    # @task-registered functions

    dag = DAG("revenue", schedule="0 3 * * *", retries=2, retry_delay=5)
    orders = dag.task(extract_orders)
    clean = dag.task(clean_orders, queue="heavy", memory_limit="2GiB")
    report = dag.command("report", ["sh", "-c", "echo done"])
    orders >> clean >> report                                   # or [a, b] >> c, a >> [b, c]

A task starts when its upstreams succeeded, unless `trigger_rule=` (Airflow's rules:
`conveyor.scheduler.rules`) says otherwise; `dag.branch(task)` adds a task whose return value
names the downstream tasks to follow (`conveyor.scheduler.branches`).

A task's options come in layers, the later winning: built-in defaults, then the registered
task's own options (`@task(queue=..., max_retries=...)`), then the DAG's keyword defaults,
then the keywords given to `dag.task`. Each declaration remembers its file and line, so a
DAG that cannot run says where to look.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conveyor.errors import ConfigError, ConveyorError
from conveyor.flow import Limit, Rate, encode, resolve
from conveyor.kinds import parse_size
from conveyor.scheduler.alerts import KINDS, Deadline, callback_specs
from conveyor.scheduler.assets import Condition, condition_of, outlet_uris
from conveyor.scheduler.errors import DagError, Location
from conveyor.scheduler.rules import ALL_SUCCESS
from conveyor.scheduler.rules import problem as rule_problem
from conveyor.scheduler.sensors import Sensors
from conveyor.tasks import REGISTRY, Task

#: How a TaskFlow argument names an upstream task's return value in a spec (JSON).
UPSTREAM_REF = "__conveyor_upstream__"
#: The exit code that skips a command task unless told otherwise (Airflow's BashOperator).
SKIP_EXIT_CODE = 99
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
_PACKAGE_DIR = str(Path(__file__).parent)


@dataclass(frozen=True)
class Options:
    """How one task runs and is retried. Zero limits mean "the executor's default"."""

    executor: str = ""          # "" = the scheduler's first configured executor
    queue: str = "default"
    retries: int = 0
    retry_delay: float = 1.0    # first retry after ~this many seconds, doubling each time
    retry_max_delay: float = 300.0
    retry_jitter: bool = True
    time_limit: float = 0.0
    memory_limit: int = 0
    priority: int = 0
    queued_timeout: float = 600.0
    heartbeat_timeout: float = 300.0
    executor_config: Mapping[str, Any] = field(default_factory=dict)
    concurrency: tuple[Limit, ...] = ()   # flow control, as on @task (see conveyor.flow)
    rate: tuple[Rate, ...] = ()
    pool: str = ""                        # a pool of DAG(pools={name: slots}) ...
    pool_slots: int = 1                   # ... of which this task takes this many
    trigger_rule: str = ALL_SUCCESS       # when it may start: one of rules.TRIGGER_RULES
    max_map_length: int = 0               # most mapped instances (0: CONVEYOR_MAX_MAP_LENGTH)
    outlets: tuple[str, ...] = ()         # asset URIs its success records an event of

    @property
    def max_attempts(self) -> int:
        return self.retries + 1


OPTION_NAMES = tuple(f.name for f in fields(Options))


def caller_location() -> Location:
    """The first stack frame outside this package: the line of the DAG file being run."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return Location(frame.f_code.co_filename, frame.f_lineno)


def checked_options(base: Options, given: Mapping[str, Any], where: Location) -> Options:
    """`base` with `given` applied, each value checked; errors name the declaring line."""
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        raise DagError(where, f"unknown task option(s) {', '.join(unknown)}: the options are "
                              f"{', '.join(OPTION_NAMES)}")
    values = dict(given)
    for name, kind in (("concurrency", Limit), ("rate", Rate)):
        if name in values:
            value = values[name]
            values[name] = (value,) if isinstance(value, kind) else tuple(value or ())
            if not all(isinstance(v, kind) for v in values[name]):
                raise DagError(where, f"option {name} takes {kind.__name__}(...) or a list of "
                                      f"them, not {value!r}")
    try:
        if "outlets" in values:   # Asset(...)s, kept as their URIs (a spec is JSON)
            values["outlets"] = tuple(outlet_uris(values["outlets"] or ()))
        if "memory_limit" in values:
            values["memory_limit"] = parse_size(values["memory_limit"], "memory_limit")
        options = replace(base, **values)
    except (ConveyorError, TypeError) as exc:
        raise DagError(where, str(exc)) from None
    _check_ranges(options, where)
    return options


def _check_ranges(o: Options, where: Location) -> None:
    bad = [name for name, ok in (
        ("retries", isinstance(o.retries, int) and o.retries >= 0),
        ("retry_delay", o.retry_delay >= 0), ("retry_max_delay", o.retry_max_delay >= 0),
        ("time_limit", o.time_limit >= 0), ("memory_limit", o.memory_limit >= 0),
        ("queued_timeout", o.queued_timeout > 0),
        ("pool_slots", isinstance(o.pool_slots, int) and o.pool_slots >= 1),
        ("max_map_length", isinstance(o.max_map_length, int) and o.max_map_length >= 0),
        ("heartbeat_timeout", o.heartbeat_timeout > 0),
    ) if not ok]
    if bad:
        raise DagError(where, f"option(s) {', '.join(bad)} out of range: retries and limits "
                              "must be >= 0, timeouts > 0")


def _task_layer(task: Task[Any, Any]) -> dict[str, Any]:
    """The options a registered task brings with it (`@task(...)`)."""
    o = task.options
    return {"queue": o.queue, "retries": max(0, o.max_retries), "retry_delay": o.retry_backoff,
            "retry_max_delay": o.retry_backoff_max, "time_limit": o.time_limit,
            "memory_limit": o.memory_limit, "priority": o.priority,
            "concurrency": tuple(x for x in o.limits if isinstance(x, Limit)),
            "rate": tuple(x for x in o.limits if isinstance(x, Rate))}


@dataclass(eq=False)
class TaskNode:
    """One task of a DAG: what runs (a registered task or a command) and its options."""

    dag: DAG
    id: str
    task: str
    command: tuple[str, ...]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    options: Options
    location: Location
    #: upstream task id -> (the node if declared with `>>`, where the edge was declared)
    upstream: dict[str, tuple[TaskNode | None, Location]] = field(default_factory=dict)
    #: a branch (`dag.branch`): what it returns names the direct downstream tasks to follow
    branch: bool = False
    #: keyword arguments mapped over (`expand`): name -> a list, or a task returning one
    mapped: dict[str, Any] = field(default_factory=dict)
    #: True: the mapped lists are zipped (`expand_zip`), else their cross product
    zipped: bool = False
    #: a command task: the exit codes that end it skipped (`skip_on_exit_code`)
    skip_codes: tuple[int, ...] = ()

    def expand(self, **mapped: Any) -> TaskNode:
        """Run one instance of this task per element (Airflow's dynamic task mapping):
        `expand(item=extract)` maps over what task `extract` returns (a list), known only
        when it has run; `expand(item=[1, 2, 3])` over a literal list. Several keywords map
        over their cross product; the task's own arguments are passed to every instance.
        A task downstream of this one receives the list of the instances' results, in
        element order."""
        return self._map(mapped, zipped=False)

    def expand_zip(self, **mapped: Any) -> TaskNode:
        """Like `expand`, but instance i gets element i of each list (all of one length)."""
        return self._map(mapped, zipped=True)

    def _map(self, mapped: Mapping[str, Any], *, zipped: bool) -> TaskNode:
        where = caller_location()
        if self.command or self.mapped or not mapped:
            why = ("a command task takes no arguments" if self.command else
                   "it is mapped already" if self.mapped else "give keyword=list or task")
            raise DagError(where, f"task {self.id!r} cannot be expanded: {why}")
        for name, value in mapped.items():
            if name in self.kwargs:
                raise DagError(where, f"task {self.id!r} maps over {name!r}, which is also "
                                      "one of its fixed arguments: give it in one place")
            if not isinstance(value, (TaskNode, list, tuple)):
                raise DagError(where, f"task {self.id!r} maps {name!r} over {value!r}: give "
                                      "a list, or a task of this DAG that returns one")
            if isinstance(value, TaskNode):
                self.add_upstream(value, where)
        self.mapped, self.zipped = dict(mapped), zipped
        return self
    #: on_success / on_failure / on_retry / on_cancel -> the callback's spec (alerts.py)
    callbacks: dict[str, dict[str, str]] = field(default_factory=dict)

    def __rshift__(self, other: TaskNode | Sequence[TaskNode]) -> Any:
        for node in _nodes(other):
            node.add_upstream(self, caller_location())
        return other

    def __lshift__(self, other: TaskNode | Sequence[TaskNode]) -> Any:
        for node in _nodes(other):
            self.add_upstream(node, caller_location())
        return other

    def __rrshift__(self, other: Sequence[TaskNode]) -> TaskNode:  # [a, b] >> self
        self << other
        return self

    def __rlshift__(self, other: Sequence[TaskNode]) -> TaskNode:  # [a, b] << self
        self >> other
        return self

    def add_upstream(self, node: TaskNode | str, where: Location) -> None:
        """Make this task wait for `node` (a node, or a task id of the same DAG)."""
        if isinstance(node, str):
            self.upstream[node] = (None, where)
        else:
            self.upstream[node.id] = (node, where)

    def spec(self) -> dict[str, Any]:
        """What a task instance needs to run and be retried, as JSON-ready data; an argument
        that is another task stands for its return value (`{UPSTREAM_REF: task id}`)."""
        o = self.options
        return {"task": self.task, "command": list(self.command),
                "args": [_ref(a) for a in self.args],
                "kwargs": {k: _ref(v) for k, v in self.kwargs.items()},
                "dag_id": self.dag.dag_id, "upstream": sorted(self.upstream),
                "time_limit": o.time_limit,
                "memory_limit": o.memory_limit, "retry_delay": o.retry_delay,
                "retry_max_delay": o.retry_max_delay, "retry_jitter": o.retry_jitter,
                "executor_config": dict(o.executor_config), "limits": self.limits(),
                "trigger_rule": o.trigger_rule, **self._expand_spec(),
                **({"skip_on_exit_code": list(self.skip_codes)} if self.skip_codes else {}),
                **({"callbacks": self.callbacks} if self.callbacks else {}),
                **({"outlets": list(o.outlets)} if o.outlets else {})}

    def _expand_spec(self) -> dict[str, Any]:
        """What the scheduler expands when the task is ready (nothing if it is not mapped)."""
        if not self.mapped:
            return {}
        return {"expand": {"kwargs": {k: _ref(v) if isinstance(v, TaskNode) else list(v)
                                      for k, v in self.mapped.items()},
                           "zip": self.zipped, "max_length": self.options.max_map_length}}

    def limits(self) -> str:
        """The flow-control header value of this task ("" if unlimited): keys formatted from
        its arguments now, at declaration (see `conveyor.flow`)."""
        o = self.options
        declared: list[Limit | Rate] = [*o.concurrency, *o.rate]
        if o.pool:
            declared.append(Limit(key=f"pool:{o.pool}", max=self.dag.pools[o.pool],
                                  weight=o.pool_slots))
        if not declared:
            return ""
        task = REGISTRY.get(self.task)
        args = [_Upstream(a.id) if isinstance(a, TaskNode) else a for a in self.args]
        kwargs = {k: _Upstream(v.id) if isinstance(v, TaskNode) else v
                  for k, v in self.kwargs.items()}
        try:
            return encode(resolve(task.fn if task else None, declared, args, kwargs))
        except ConveyorError as exc:
            raise DagError(self.location, f"task {self.id!r}: {exc}") from None


class _Upstream:
    """An upstream task's value in an argument: unknown when the DAG is declared."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def __format__(self, spec: str) -> str:
        raise ConfigError(f"a limit key cannot use the argument that is task "
                          f"{self.task_id!r}'s return value: it is known only when that runs")


def _ref(value: Any) -> Any:
    """An argument as a spec holds it: a task (also inside a list, as the canvas passes a
    group's results) becomes a reference to its return value."""
    if isinstance(value, list):
        return [_ref(each) for each in value]
    return {UPSTREAM_REF: value.id} if isinstance(value, TaskNode) else value


def _nodes(other: TaskNode | Sequence[TaskNode]) -> list[TaskNode]:
    items = [other] if isinstance(other, TaskNode) else list(other)
    for item in items:
        if not isinstance(item, TaskNode):
            raise DagError(caller_location(), f"cannot order a task after {item!r}: use tasks "
                                              "returned by dag.task() or dag.command()")
    return items


def _timestamp(value: datetime | str | float | None, where: Location,
               dag_id: str) -> float | None:
    """A start date as Unix seconds (naive dates and times are UTC)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(
            str(value).replace("Z", "+00:00"))
    except ValueError:
        raise DagError(where, f"DAG {dag_id!r}: start_date {value!r} is not an ISO-8601 date "
                              "or a datetime, e.g. '2026-11-01' or '2026-11-01T03:00:00Z'"
                       ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _schedule_problem(expr: str, timezone: str) -> str:
    """Why `expr` cannot be a schedule ("" when it can).

    The cron module (croniter, dateutil) is imported here, not at the top: `DAG` is part of
    the package's public API, so every worker process imports this module, and only a DAG
    with a schedule needs croniter.
    """
    from conveyor.scheduler import cron
    return cron.problem(expr, timezone)


def _alerts(given: dict[str, Any], deadline: Deadline | None, where: Location, dag_id: str
            ) -> tuple[dict[str, dict[str, str]], dict[str, Any] | None]:
    """A DAG's callbacks and deadline as its runs keep them; DagError at its line."""
    try:
        if deadline is not None and not isinstance(deadline, Deadline):
            raise ConfigError(f"deadline must be a Deadline(reference=..., interval=..., "
                              f"callback=...), not {deadline!r}")
        return (callback_specs(given, f"DAG {dag_id!r}"),
                None if deadline is None else deadline.spec())
    except ConveyorError as exc:
        raise DagError(where, str(exc)) from None


class DAG(Sensors):
    """A named set of tasks with dependencies, optionally run on a cron schedule."""

    def __init__(self, dag_id: str, *,
                 schedule: str | Condition | Sequence[Condition] | None = None,
                 timezone: str = "UTC",
                 description: str = "", start_date: datetime | str | float | None = None,
                 catchup: bool = True, max_active_runs: int = 16,
                 pools: Mapping[str, int] | None = None, on_success: Any = None,
                 on_failure: Any = None, on_cancel: Any = None, on_retry: Any = None,
                 deadline: Deadline | None = None, pin_code: bool = False,
                 pin_timeout: float = 600.0, pin_policy: str = "wait",
                 **defaults: Any) -> None:
        """`start_date`: the first logical date (ISO text, a datetime, or Unix seconds);
        `catchup`: create the runs of ticks missed while no scheduler ran (from the start
        date, or since the last tick), at most `max_active_runs` queued or running at once;
        with `catchup=False` only the latest missed tick gets a run. `pools`: named slot
        counts (Airflow's pools) that tasks take with `pool=NAME, pool_slots=N`; a pool is
        the flow-control key `pool:NAME`, resized live by `conveyor limits set`.
        `on_success` / `on_failure` / `on_cancel`: a registered task sent when a run ends
        so; `on_retry`: every task's, unless it gives its own (a run is never retried);
        `deadline`: see `alerts.Deadline`. `pin_code`: a run's later tasks go only to
        workers of the code version its first task started on while one is alive; after
        `pin_timeout` seconds without one, `pin_policy` "wait" keeps waiting, "newest" sends
        the task to any worker (scheduler/pinning.py). `schedule` is a cron expression, or
        an `Asset` / `Event` condition (`a & b`, `a | b`, a list meaning all): a run when it
        holds over the events since the DAG's last such run (scheduler/assets.py)."""
        self.location = caller_location()
        #: the asset / event condition it is scheduled on (None: cron or none)
        self.assets: Condition | None = None
        if schedule is not None and not isinstance(schedule, str):
            try:
                self.assets = condition_of(schedule)
            except ConveyorError as exc:
                raise DagError(self.location, f"DAG {dag_id!r}: {exc}") from None
            schedule = None
        if not isinstance(dag_id, str) or not _ID.match(dag_id):
            raise DagError(self.location, f"DAG id {dag_id!r} must be 1-200 letters, digits, "
                                          "'_', '.' or '-'")
        if schedule is not None and (why := _schedule_problem(schedule, timezone)):
            raise DagError(self.location, f"DAG {dag_id!r}: {why}")
        if not isinstance(max_active_runs, int) or max_active_runs < 1:
            raise DagError(self.location, f"DAG {dag_id!r}: max_active_runs must be a whole "
                                          f"number of at least 1, not {max_active_runs!r}")
        self.start_date = _timestamp(start_date, self.location, dag_id)
        self.catchup = bool(catchup)
        self.max_active_runs = max_active_runs
        self.pools = dict(pools or {})
        if not all(isinstance(n, int) and n >= 1 for n in self.pools.values()):
            raise DagError(self.location, f"DAG {dag_id!r}: pools map names to a number of "
                                          f"slots of at least 1, not {self.pools!r}")
        self.dag_id = dag_id
        if pin_policy not in ("wait", "newest") or not isinstance(pin_timeout, (int, float)) \
                or pin_timeout < 0:
            raise DagError(self.location, f"DAG {dag_id!r}: pin_policy must be 'wait' or "
                                          f"'newest' (not {pin_policy!r}) and pin_timeout "
                                          f"seconds of 0 or more (not {pin_timeout!r})")
        self.pin_code, self.pin_timeout, self.pin_policy = bool(pin_code), pin_timeout, pin_policy
        self.callbacks, self.deadline = _alerts(
            {"on_success": on_success, "on_failure": on_failure, "on_cancel": on_cancel,
             "on_retry": on_retry}, deadline, self.location, dag_id)
        #: the tasks' default on_retry (the DAG's own callbacks are about its runs' ends)
        self.task_callbacks = {"on_retry": self.callbacks.pop("on_retry")} \
            if "on_retry" in self.callbacks else {}
        self.schedule = schedule
        self.timezone = timezone
        self.description = description
        checked_options(Options(), defaults, self.location)
        self.defaults = dict(defaults)
        self.tasks: dict[str, TaskNode] = {}
        self.version = ""   # set by the loader: a hash of the DAG file's source
        self.source = ""    # and that source, kept once per version (a run shows it)
        self.file = self.location.file

    def __repr__(self) -> str:
        return f"DAG({self.dag_id!r}, tasks={len(self.tasks)})"

    def task(self, task: Task[Any, Any] | str, *inputs: Any, id: str | None = None,
             args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
             upstream: Sequence[TaskNode | str] = (), **options: Any) -> TaskNode:
        """Add a run of a registered task (the `@task` object, or its name as a string).

        Positional `inputs` come before `args`. An argument that is another task of the DAG
        (TaskFlow: `dag.task(clean, orders)`) makes this task its downstream and is replaced,
        when this task runs, by what that task returned.
        """
        where = caller_location()
        args = (*inputs, *args)
        upstream = (*upstream, *(v for v in (*args, *(kwargs or {}).values())
                                 if isinstance(v, TaskNode)))
        if isinstance(task, Task):
            name, default_id, layer = task.name, task.fn.__name__, _task_layer(task)
        elif isinstance(task, str) and task:
            name, default_id, layer = task, task.rsplit(".", 1)[-1], {}
        else:
            raise DagError(where, f"{task!r} is not a registered task: decorate the function "
                                  "with @conveyor.task, or pass the task's name")
        base = checked_options(Options(), layer, where)
        return self._add(id or default_id, name, (), args, kwargs, upstream, base, options, where)

    def branch(self, task: Task[Any, Any] | str, *inputs: Any, **given: Any) -> TaskNode:
        """Add a branch task (Airflow's `@task.branch`): like `dag.task`, and what it returns
        (a task id, a list of them, or None) names the direct downstream tasks to follow;
        the others are skipped (see `conveyor.scheduler.branches`)."""
        node = self.task(task, *inputs, **given)
        node.branch = True
        return node

    def command(self, id: str, command: Sequence[str], *,
                upstream: Sequence[TaskNode | str] = (),
                skip_on_exit_code: int | Sequence[int] | None = SKIP_EXIT_CODE,
                **options: Any) -> TaskNode:
        """Add a shell-command task: `command` is exec'd (no shell unless you call one).
        Exiting with `skip_on_exit_code` (99 by default, as Airflow's BashOperator; a list
        of codes, or None for none) ends it skipped instead of failed."""
        where = caller_location()
        if isinstance(command, str) or not command or not all(
                isinstance(part, str) for part in command):
            raise DagError(where, f"task {id!r}: command must be a non-empty list of strings, "
                                  f"e.g. ['sh', '-c', 'echo hi'] (got {command!r})")
        codes = _exit_codes(skip_on_exit_code, id, where)
        node = self._add(id, "", tuple(command), (), None, upstream, Options(), options, where)
        node.skip_codes = codes
        return node

    def _add(self, task_id: str, name: str, command: tuple[str, ...], args: Sequence[Any],
             kwargs: Mapping[str, Any] | None, upstream: Sequence[TaskNode | str],
             base: Options, options: Mapping[str, Any], where: Location) -> TaskNode:
        if not isinstance(task_id, str) or not _ID.match(task_id):
            raise DagError(where, f"task id {task_id!r} must be 1-200 letters, digits, '_', '.' "
                                  "or '-'")
        if task_id in self.tasks:
            raise DagError(where, f"DAG {self.dag_id!r} already has a task {task_id!r} (declared "
                                  f"at {self.tasks[task_id].location}): give this one id=...")
        options = dict(options)
        try:
            callbacks = {**self.task_callbacks, **callback_specs(
                {k: options.pop(k, None) for k in KINDS}, f"task {task_id!r}")}
        except ConveyorError as exc:
            raise DagError(where, str(exc)) from None
        merged = checked_options(checked_options(base, self.defaults, self.location),
                                 options, where)
        if why := rule_problem(merged.trigger_rule):
            raise DagError(where, f"task {task_id!r} of DAG {self.dag_id!r}: {why}")
        merged = replace(merged, trigger_rule=str(merged.trigger_rule))   # an enum member too
        if merged.pool and merged.pool not in self.pools:
            raise DagError(where, f"task {task_id!r}: pool {merged.pool!r} is not declared: "
                                  f"give its slots in DAG(..., pools={{{merged.pool!r}: N}})")
        node = TaskNode(self, task_id, name, command, tuple(args), dict(kwargs or {}), merged,
                        where, callbacks=callbacks)
        for parent in upstream:
            node.add_upstream(parent, where)
        node.limits()  # a key that cannot be formatted fails here, at its line
        self.tasks[task_id] = node
        return node

    # -- checks -------------------------------------------------------------------------------

    def validate(self, executors: Sequence[str] = ()) -> None:
        """Raise DagError for a missing dependency, a cycle, or an unconfigured executor."""
        if not self.tasks:
            raise DagError(self.location, f"DAG {self.dag_id!r} has no tasks: add some with "
                                          "dag.task(...) or dag.command(...)")
        for node in self.tasks.values():
            self._check_upstream(node)
            if executors and node.options.executor and node.options.executor not in executors:
                raise DagError(node.location, (
                    f"task {node.id!r} of DAG {self.dag_id!r} uses executor "
                    f"{node.options.executor!r}, which this scheduler does not have "
                    f"(configured: {', '.join(executors)}): add it to --executors "
                    "(CONVEYOR_EXECUTORS) or change the task's executor"))
        self.order()

    def _check_upstream(self, node: TaskNode) -> None:
        for parent_id, (parent, where) in node.upstream.items():
            known = self.tasks.get(parent_id)
            if known is None or (parent is not None and parent is not known):
                owner = f" (it belongs to DAG {parent.dag.dag_id!r})" if parent else ""
                raise DagError(where, (
                    f"task {node.id!r} of DAG {self.dag_id!r} depends on {parent_id!r}, which "
                    f"is not a task of this DAG{owner}; its tasks are: "
                    f"{', '.join(sorted(self.tasks)) or 'none'}"))

    def order(self) -> list[str]:
        """Task ids, parents before children (Kahn); DagError naming a cycle if there is one."""
        waiting = {task_id: len(node.upstream) for task_id, node in self.tasks.items()}
        children: dict[str, list[str]] = {task_id: [] for task_id in self.tasks}
        for parent, child in self.edges():
            children[parent].append(child)
        ready = [task_id for task_id, count in waiting.items() if count == 0]
        result: list[str] = []
        while ready:
            task_id = ready.pop()
            result.append(task_id)
            for child in children[task_id]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        if len(result) < len(self.tasks):
            self._raise_cycle({t for t, count in waiting.items() if count > 0})
        return result

    def _raise_cycle(self, stuck: set[str]) -> None:
        """Walk upstream inside the tasks that never became ready until one repeats."""
        path = [min(stuck)]
        while path.count(path[-1]) < 2:
            path.append(min(p for p in self.tasks[path[-1]].upstream if p in stuck))
        cycle = list(reversed(path[path.index(path[-1]):]))   # parent -> child order
        # point at the edge declared last (the likeliest mistake)
        where = max((self.tasks[child].upstream[parent][1] for parent, child
                     in zip(cycle, cycle[1:], strict=False)), key=lambda loc: loc.line)
        raise DagError(where, f"DAG {self.dag_id!r} has a cycle: {' -> '.join(cycle)}; "
                              "remove one of these dependencies")

    def edges(self) -> list[tuple[str, str]]:
        """(upstream, downstream) pairs."""
        return [(up, node.id) for node in self.tasks.values() for up in node.upstream]


def _exit_codes(given: int | Sequence[int] | None, task_id: str,
                where: Location) -> tuple[int, ...]:
    """`skip_on_exit_code` as a tuple of exit codes, or a DagError saying what it takes."""
    codes = () if given is None else (given,) if isinstance(given, int) else tuple(given)
    if any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 255 for c in codes):
        raise DagError(where, f"task {task_id!r}: skip_on_exit_code must be an exit code "
                              f"(1-255), a list of them, or None (got {given!r})")
    return tuple(sorted(set(codes)))
