"""The canvas, as Celery users write it: signatures, `chain`, `group` and `chord`.

    from conveyor import chain, chord, group
    from myapp.tasks import add, tsum

    handle = chain(add.s(1, 2), add.s(10), add.s(100)).enqueue()
    handle.result(timeout=30)                             # 113: ((1 + 2) + 10) + 100
    chord(group(add.s(i, i) for i in range(4)), tsum.s()).enqueue().result()   # 12

This module is the algebra only: values that describe work, built by a producer at run
time, composable (a chain may hold groups, a group chains, a chord either). `.enqueue()`
turns one into an ad-hoc run of the scheduler (`conveyor.scheduler.canvas`): durable,
listed by `conveyor runs list` and the dashboard as DAG `canvas.<name>`, each task retried
like a DAG task. Results pass as Celery passes them: a step of a chain gets the previous
step's result as its first argument (not an immutable `.si()` signature); what follows a
group (a chord's callback) gets the list of the group's results, in the group's order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeAlias

from conveyor.errors import ConfigError

#: Anything that can be a step of a canvas.
Canvas: TypeAlias = "Signature | chain | group | chord"


class Handle(Protocol):
    """A started canvas (`conveyor.scheduler.canvas.CanvasHandle`)."""

    @property
    def run_id(self) -> str: ...

    def result(self, timeout: float | None = 10.0) -> Any: ...

    def status(self) -> str: ...


#: How `.enqueue()` starts a canvas: `conveyor.scheduler.canvas.start`, which sets it when
#: imported (the package does: `import conveyor`). The scheduler depends on this module,
#: never the reverse: `Task.s()` builds a signature here, and the scheduler imports tasks.
_STARTER: list[Callable[..., Handle]] = []


def use_starter(start: Callable[..., Handle]) -> None:
    """Make `start` what `.enqueue()` calls (the scheduler's, once)."""
    _STARTER[:] = [start]


class _Composable:
    """What every canvas element can do: `a | b` chains, `.enqueue()` starts a run."""

    def __or__(self, other: Canvas) -> chain:
        return chain(self, other)

    def enqueue(self, *, name: str = "", state_url: str = "", broker_url: str = "",
                executors: Iterable[str] = ()) -> Handle:
        """Start this canvas as an ad-hoc scheduler run; `handle.result()` waits for it.

        `name` (default: the last task's name) makes the run's DAG id `canvas.<name>`.
        The state store, the broker to wake the scheduler through and the executors are
        the scheduler's own settings (CONVEYOR_STATE_URL, CONVEYOR_BROKER_URL,
        CONVEYOR_EXECUTORS) unless given here."""
        if not _STARTER:
            raise ConfigError("no scheduler to start a canvas with: import conveyor first")
        return _STARTER[0](self, name=name, state_url=state_url, broker_url=broker_url,
                           executors=tuple(executors))


@dataclass(frozen=True, eq=True)
class Signature(_Composable):
    """One task with some of its arguments: `task.s(1, x=2)` (Celery's `signature`).

    `immutable` (`task.si(...)`): it does not take the previous step's result. `options`
    are DAG task options (`queue`, `retries`, `retry_delay`, `time_limit`, `executor`...),
    set with `.set(queue="heavy")`, over the registered task's own."""

    task: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    immutable: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise TypeError(f"a signature names a registered task, not {self.task!r}")

    def set(self, **options: Any) -> Signature:
        """This signature with DAG task options added (they win over earlier ones)."""
        return replace(self, options={**self.options, **options})

    def clone(self, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None
              ) -> Signature:
        """A partial application, as Celery's: `args` appended, `kwargs` merged."""
        return replace(self, args=(*self.args, *args), kwargs={**self.kwargs, **(kwargs or {})})

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task}.{'si' if self.immutable else 's'}({', '.join(shown)})"


def signature(task: Any, args: Iterable[Any] = (),
              kwargs: Mapping[str, Any] | None = None, *, immutable: bool = False,
              **options: Any) -> Signature:
    """A signature of a task (the `@task` object) or of a task's name (one the producer
    cannot import)."""
    name = task if isinstance(task, str) else task.name
    return Signature(name, tuple(args), dict(kwargs or {}), immutable, dict(options))


def _steps(items: tuple[Any, ...], kind: str) -> tuple[Canvas, ...]:
    """`kind(a, b)` or `kind([a, b])` or `kind(generator)`: the elements, each checked."""
    if len(items) == 1 and not isinstance(items[0], _Composable):
        items = tuple(items[0])
    for item in items:
        if not isinstance(item, _Composable):
            raise TypeError(f"{kind}() takes signatures (task.s(...)), chains, groups or "
                            f"chords, not {item!r}")
    return items


class chain(_Composable):  # noqa: N801 - Celery's name
    """Steps run one after the other, each given the previous one's result first."""

    def __init__(self, *steps: Any) -> None:
        flat: list[Canvas] = []
        for step in _steps(steps, "chain"):
            flat.extend(step.steps if isinstance(step, chain) else (step,))
        if not flat:
            raise TypeError("chain() needs at least one step")
        self.steps: tuple[Canvas, ...] = tuple(flat)

    def __repr__(self) -> str:
        return " | ".join(repr(step) for step in self.steps)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, chain) and other.steps == self.steps

    __hash__ = None  # type: ignore[assignment]


class group(_Composable):  # noqa: N801 - Celery's name
    """Members run in parallel; the group's result is the list of theirs, in order."""

    def __init__(self, *members: Any) -> None:
        self.members: tuple[Canvas, ...] = _steps(members, "group")

    def __repr__(self) -> str:
        return f"group({', '.join(repr(m) for m in self.members)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, group) and other.members == self.members

    __hash__ = None  # type: ignore[assignment]


class chord(_Composable):  # noqa: N801 - Celery's name
    """A group, then `body` given the list of the group's results. If a member fails for
    good the body never runs and the chord fails with that member's error (Celery's
    ChordError); `chain(group(...), body)` means the same."""

    def __init__(self, header: group | Iterable[Canvas], body: Canvas) -> None:
        self.header = header if isinstance(header, group) else group(*header)
        if not isinstance(body, _Composable):
            raise TypeError(f"a chord's body is a signature (callback.s()), not {body!r}")
        self.body = body

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, chord) and (other.header, other.body) == (self.header,
                                                                           self.body)

    __hash__ = None  # type: ignore[assignment]
