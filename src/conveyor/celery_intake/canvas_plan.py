"""A Celery canvas as a Conveyor canvas (`conveyor.canvas`): pure, no I/O.

A Celery producer sends a chain as its first task's message whose embed lists the rest
(last step first), and each step may be a nested canvas Celery serialized whole: a group
(`celery.group`), a chord (`celery.chord`: a group followed by a step, which is what Celery
makes of `chain(..., group(...), step)`), a chain (`celery.chain`). A chord arrives as one
message per member of its group, each carrying the callback: `canvas_runs.py` collects them.
Here each becomes the `chain`/`group`/`chord` of signatures the Python canvas is made of,
so it runs as the same kind of scheduler run (`conveyor.scheduler.canvas`), and every
signature keeps the Celery task id its result is written under (`Plan.ids`).

What cannot be honoured is refused with `CanvasRefused`: link/link_error callbacks (Celery
calls them with the failed request; a run has no such hook), a signature with no task id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.canvas import Canvas, Signature, chain, chord, group
from conveyor.celery_intake.canvas_embed import CanvasRefused
from conveyor.celery_intake.names import intake_queue

#: Options of a chord member's last step that say which chord it belongs to (kept by the
#: caller), and options that only matter to Celery's own publishing.
CHORD_OPTIONS = ("chord", "group_id", "group_index")


@dataclass(frozen=True)
class ChordIds:
    """What Celery's backend is told when a member fails for good: `callback` (the id the
    producer's AsyncResult of the chord has) fails with ChordError; `first` is the run's
    signature that would have taken the results."""

    callback: str
    first: int


@dataclass
class Plan:
    """A canvas to run, and the Celery task id of each of its signatures (by `id()`)."""

    canvas: Canvas | None = None
    ids: dict[int, str] = field(default_factory=dict)
    chords: list[ChordIds] = field(default_factory=list)

    def step(self, sig: Mapping[str, Any], queue: str) -> Canvas:
        """One Celery signature (a task or a nested canvas) as a canvas element; `queue`:
        the Celery queue of the message it came with (where its tasks run by default)."""
        if not isinstance(sig, Mapping) or not isinstance(sig.get("task"), str):
            raise CanvasRefused(f"not a Celery signature: {sig!r}")
        kind = sig.get("subtask_type") or sig["task"].removeprefix("celery.")
        kwargs = sig.get("kwargs") or {}
        if kind == "chain":
            return chain(*[self.step(each, queue) for each in _listed(kwargs, "tasks")])
        if kind == "group":
            return group(*[self.step(each, queue) for each in _listed(kwargs, "tasks")])
        if kind == "chord":
            header = self.step(kwargs.get("header") or {}, queue)
            return self.chord(header if isinstance(header, group) else group(header),
                              kwargs.get("body") or {}, queue)
        return self.task(sig, queue)

    def chord(self, header: group, body: Mapping[str, Any], queue: str) -> chord:
        """`header` then `body` (a Celery signature) given the list of its results."""
        made = self.step(body, queue)
        first = made
        while not isinstance(first, Signature):   # the task that takes the results
            first = first.steps[0] if isinstance(first, chain) else _refuse_group(body)
        callback = (body.get("options") or {}).get("task_id") or self.ids[id(first)]
        self.chords.append(ChordIds(str(callback), id(first)))
        return chord(header, made)

    def task(self, sig: Mapping[str, Any], queue: str, *, immutable: bool | None = None
             ) -> Signature:
        """One task; `immutable` (None: as the signature says) ignores the previous result."""
        options = sig.get("options") or {}
        links = sorted(k for k in ("link", "link_error") if options.get(k))
        if links:
            raise CanvasRefused(f"{sig['task']} has {', '.join(links)} callbacks, which the "
                                "intake does not run: chain the tasks instead (a.s() | b.s())")
        task_id, args, kwargs = options.get("task_id"), sig.get("args", []), sig.get("kwargs")
        if not isinstance(task_id, str) or not isinstance(args, list) or not isinstance(
                kwargs or {}, dict):
            raise CanvasRefused(f"a step ({sig['task']}) has no task id, or its args and "
                                "kwargs are not a list and a dict")
        own = options.get("queue")
        dag_options: dict[str, Any] = {
            "queue": intake_queue(own if isinstance(own, str) and own else queue)}
        limit = options.get("time_limit")
        if isinstance(limit, int | float) and limit > 0:
            dag_options["time_limit"] = float(limit)
        made = Signature(sig["task"], tuple(args), dict(kwargs or {}),
                         bool(sig.get("immutable")) if immutable is None else immutable,
                         dag_options)
        self.ids[id(made)] = task_id
        return made


def first_step(task: str, task_id: str, args: list[Any], kwargs: dict[str, Any],
               queue: str) -> dict[str, Any]:
    """The Celery signature of a message's own task (its args final: immutable)."""
    return {"task": task, "args": args, "kwargs": kwargs, "immutable": True,
            "options": {"task_id": task_id, "queue": queue}}


def chain_plan(first: Mapping[str, Any], rest: Sequence[Any], queue: str) -> Plan:
    """The plan of a chain message: its own task, then `rest` (the embed's `chain`, last
    step first, as Celery sends it)."""
    made = Plan()
    made.canvas = chain(made.step(first, queue),
                        *[made.step(each, queue) for each in reversed(list(rest))])
    return made


def chord_plan(members: Sequence[Sequence[Mapping[str, Any]]], body: Mapping[str, Any],
               queue: str) -> Plan:
    """The plan of a chord from its members (each the chain of signatures it is, in order:
    a member that is one task is a chain of one) and its callback."""
    made = Plan()
    header = group(*[chain(*[made.step(sig, queue) for sig in member]) for member in members])
    made.canvas = made.chord(header, body, queue)
    return made


def membership(headers: Mapping[str, Any], embed: Mapping[str, Any]
               ) -> tuple[str, int, Mapping[str, Any], list[Any]] | None:
    """(group id, index, callback, the member's chain after its first task) if this message
    starts a member of a chord's group, else None. A member that is one task carries the
    callback in its embed (`chord`) and the group in its headers; one that is a chain
    carries them in the options of its last step (the first of the embed's `chain`)."""
    rest = list(embed.get("chain") or [])
    if embed.get("chord"):
        group_id, index = headers.get("group"), headers.get("group_index")
        if not isinstance(group_id, str) or not group_id or not isinstance(index, int):
            raise CanvasRefused("a chord member without 'group' and 'group_index' headers "
                                "(Celery 5 sends both): upgrade the producer's Celery")
        return group_id, index, embed["chord"], rest
    last = rest[0] if rest and isinstance(rest[0], Mapping) else {}
    options = last.get("options") or {}
    if not options.get("chord"):
        return None
    group_id, index = options.get("group_id"), options.get("group_index")
    if not isinstance(group_id, str) or not isinstance(index, int):
        raise CanvasRefused("a chain in a chord's group whose last step does not say which "
                            "group (group_id, group_index): upgrade the producer's Celery")
    rest[0] = {**last, "options": {k: v for k, v in options.items() if k not in CHORD_OPTIONS}}
    return group_id, index, options["chord"], rest


def starts_a_run(task: str, task_id: str, queue: str, headers: Mapping[str, Any],
                 args: list[Any], kwargs: dict[str, Any], embed: Mapping[str, Any]) -> bool:
    """True if this message starts a canvas run (a chain, or a member of a chord's group);
    raises CanvasRefused for one the intake cannot run. What one message shows is checked:
    a chord's other members are checked when they come."""
    if not embed.get("chain") and not embed.get("chord"):
        return False
    plan_of(task, task_id, queue, headers, args, kwargs, embed,
            lambda group_id, index, member: [member])
    return True


def plan_of(task: str, task_id: str, queue: str, headers: Mapping[str, Any], args: list[Any],
            kwargs: dict[str, Any], embed: Mapping[str, Any],
            join: Callable[[str, int, list[Any]], list[list[Any]] | None]
            ) -> tuple[Plan, str] | None:
    """The plan of the canvas this message starts, and the canvas's key (its first task's
    id, or its chord's group id); None while a chord waits for members. `join(group id,
    index, member)`: every member of the chord in order once all came, else None."""
    first = first_step(task, task_id, args, kwargs, queue)
    member = membership(headers, embed)
    if member is None:
        return chain_plan(first, embed.get("chain") or [], queue), task_id
    group_id, index, callback, rest = member
    members = join(group_id, index, [first, *reversed(rest)])
    if members is None:
        return None
    return chord_plan(members, callback, queue), group_id


def _listed(kwargs: Mapping[str, Any], name: str) -> list[Any]:
    found = kwargs.get(name)
    if not isinstance(found, list) or not found:
        raise CanvasRefused(f"a nested canvas without {name}: {dict(kwargs)!r}")
    return found


def _refuse_group(body: Mapping[str, Any]) -> Signature:
    raise CanvasRefused(f"a chord's callback that starts with a group ({body.get('task')}), "
                        "which the intake does not run: make the callback one task or a chain")
