"""Which Celery canvas messages the intake runs, and the headers that carry the rest.

`conversion.py` asks `canvas_headers` of every message's embed; the outcome loop's
`canvas.Follower` reads the headers back when the task ends (see `canvas.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CHAIN, CHORD = "celery_chain", "celery_chord"
GROUP, GROUP_INDEX = "celery_group", "celery_group_index"


class CanvasRefused(Exception):
    """A canvas the intake does not run: the reason, for the dead letter and for `get()`."""


def canvas_headers(embed: Mapping[str, Any], headers: Mapping[str, Any],
                   follows: bool) -> dict[str, str]:
    """The Conveyor headers that carry what follows this message (empty: nothing does);
    `follows`: outcomes come back to the intake (a result backend is configured).
    Raises CanvasRefused for what the intake does not run."""
    refuse_links(embed)
    chain, chord = embed.get("chain") or [], embed.get("chord")
    if not chain and not chord:
        return {}
    if not follows:
        raise CanvasRefused("a Celery chain or chord needs --celery-result-backend: the "
                            "intake follows a canvas from its tasks' results")
    if chain and chord:
        raise CanvasRefused("a chain inside a chord's group is not run by the intake: make "
                            "each member of the group a single task")
    out: dict[str, str] = {}
    if chain:
        if not isinstance(chain, list):
            raise CanvasRefused(f"embed 'chain' is not a list of signatures: {chain!r}")
        for step in chain:
            _check_signature(step, "a chain step")
        out[CHAIN] = json.dumps(chain)
    if chord:
        _check_signature(chord, "a chord's callback")
        group, index = headers.get("group"), headers.get("group_index")
        if not isinstance(group, str) or not group or not isinstance(index, int):
            raise CanvasRefused("a chord member without 'group' and 'group_index' headers "
                                "(Celery 5 sends both): upgrade the producer's Celery")
        out |= {CHORD: json.dumps(chord), GROUP: group, GROUP_INDEX: str(index)}
    return out


def refuse_links(embed: Mapping[str, Any]) -> None:
    """CanvasRefused if the message has link/link_error callbacks: Celery calls an errback
    with the failed request and a callback with the result, outside any chain; neither a
    run nor a followed chain has such a hook, and dropping one silently would lose work."""
    links = sorted(k for k in ("callbacks", "errbacks") if embed.get(k))
    if links:
        raise CanvasRefused(f"uses Celery link/link_error callbacks ({', '.join(links)}), "
                            "which the intake does not run: chain the tasks instead "
                            "(a.s() | b.s())")


def _check_signature(sig: Any, what: str) -> None:
    """A plain task signature, as the intake can run it; else CanvasRefused."""
    if not isinstance(sig, dict) or not isinstance(sig.get("task"), str):
        raise CanvasRefused(f"{what} is not a Celery signature: {sig!r}")
    options = sig.get("options") or {}
    kind = sig.get("subtask_type")
    if kind or sig["task"] in ("celery.chord", "celery.group", "celery.chain"):
        raise CanvasRefused(f"{what} is a {kind or sig['task']} (a group or chord inside a "
                            "chain, or a canvas as a chord's callback), which the intake "
                            "does not run: keep chains and chord callbacks to single tasks")
    nested = sorted(k for k in ("link", "link_error", "chain", "chord") if options.get(k))
    if nested:
        raise CanvasRefused(f"{what} ({sig['task']}) has its own {', '.join(nested)}, which "
                            "the intake does not run")
    if not isinstance(options.get("task_id"), str) or not isinstance(
            sig.get("args", []), list) or not isinstance(sig.get("kwargs", {}), dict):
        raise CanvasRefused(f"{what} ({sig['task']}) has no task id, or its args and kwargs "
                            "are not a list and a dict")
