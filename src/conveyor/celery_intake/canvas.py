"""Celery's canvas through the intake: chains and chords followed as a Celery worker would.

An unchanged Celery producer sends a canvas as plain task messages (protocol 2) whose body's
embed says what comes next:

* a chain: the first task's message carries `chain`, the remaining steps' signatures, last
  step first; each step's task id was chosen by the producer (`options.task_id`), and the
  AsyncResult the producer holds is the last step's;
* a group: one message per member, sharing the `group` header; nothing comes next;
* a chord: the group's members, each carrying `chord` (the callback's signature) and
  `group`/`group_index` headers; the producer wrote the group's size in the result backend
  (`celery-taskset-meta-<group>.s`) and holds the callback's AsyncResult.

The intake records what comes next in the Conveyor message's headers (`conversion.py`
calls `canvas_headers`), and the outcome loop follows it when the task ends (`Follower`):
a chain step's success publishes the next step with the result as its first argument (not
for an immutable `.si()`); a chord member's outcome is recorded in a Redis hash beside
Celery's results (one field per member: a redelivered outcome is recorded once), and the
member that completes the hash publishes the callback with the list of results in group
order, or, if a member failed, stores the callback's FAILURE as Celery does (`ChordError`,
"Dependency <id> raised ..."). A failed chain step publishes nothing: the steps after it stay
PENDING and the producer's `get()` raises the step's error, as with Celery.

At least once, without duplicates: the next step is published before the outcome is acked,
so a crash publishes it again; each is published with the unique key of its Celery task id,
held for a day (Celery's result expiry) once published, so a second publish is a duplicate
that publishes nothing. A follower killed between taking the key and publishing leaves a
key that lapses (PUBLISHING) before the outcome comes back, so that one is not lost.

What the intake cannot honour is refused at once, with a reason (dead letter, and the
producer's `get()` raises): link/link_error callbacks, a group or a chord inside a chain,
a chain inside a chord's group, a callback that is itself a canvas, and any chain or chord
without `--celery-result-backend` (the outcomes the intake follows are the results).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from conveyor.celery_intake.canvas_embed import (
    CHAIN,
    CHORD,
    GROUP,
    GROUP_INDEX,
)
from conveyor.celery_intake.conversion import JSON_TYPE, Accepted, CeleryMessage, convert
from conveyor.celery_intake.feed import publication
from conveyor.celery_intake.names import intake_queue
from conveyor.celery_intake.results import RedisResults, exception, meta
from conveyor.client import Client
from conveyor.events import Event
from conveyor.message import new_id
from conveyor.tasks import Task

log = logging.getLogger("conveyor.celery_intake")

#: Seconds a follow-up's unique key is held, and a chord's join kept: Celery's default
#: `result_expires`, one day.
KEPT = 86400
#: Seconds a follow-up's key is held while it is being published (then KEPT): less than
#: the broker's lease on the outcome (60 s), after which the outcome is delivered again.
PUBLISHING = 20.0
#: Celery's key for a chord's group size, written by the producer (`set_chord_size`).
SIZE_KEY = "celery-taskset-meta-{group}.s"
JOIN_KEY = "conveyor-chord-{group}"


def step_message(sig: Mapping[str, Any], first: list[Any], queue: str,
                 parent: Mapping[str, str], rest: Sequence[Any] = ()) -> CeleryMessage:
    """The Celery message a Celery worker would send for `sig`: `first` before its args
    (unless it is immutable), on `queue` unless it names its own, after the task whose
    headers are `parent`, carrying `rest` of its chain."""
    options = sig.get("options") or {}
    args = list(sig.get("args") or [])
    if not sig.get("immutable"):
        args = first + args
    headers: dict[str, Any] = {
        "task": sig["task"], "id": options["task_id"], "retries": 0,
        "root_id": parent.get("celery_root_id") or parent.get("celery_id"),
        "parent_id": parent.get("celery_id"),
        "timelimit": [options.get("time_limit"), options.get("soft_time_limit")]}
    embed = {"callbacks": None, "errbacks": None, "chain": list(rest) or None, "chord": None}
    body = json.dumps([args, sig.get("kwargs") or {}, embed]).encode()
    named = options.get("queue")
    return CeleryMessage(queue=named if isinstance(named, str) and named else queue,
                         content_type=JSON_TYPE, content_encoding="utf-8", headers=headers,
                         body=body)


class Follower:
    """Follows chains and chords from their tasks' outcomes (see the module docstring).

    `publish(raw, unique_key)` sends a Celery-shaped message into Conveyor as the feed
    would, once per key."""

    def __init__(self, backend: RedisResults,
                 publish: Callable[[CeleryMessage, str], None]) -> None:
        self.backend = backend
        self.publish = publish

    def follow(self, event: Event, document: Mapping[str, Any] | None) -> None:
        """After the task's result `document` was written: what comes next, if anything."""
        headers = event.headers
        if document is None or not (headers.get(CHAIN) or headers.get(CHORD)):
            return
        ok = document.get("status") == "SUCCESS"
        if headers.get(CHAIN) and ok:
            self._next_step(headers, document["result"])
        elif headers.get(CHORD):
            self._chord_part(headers, document)

    def _next_step(self, headers: Mapping[str, str], result: Any) -> None:
        chain = json.loads(headers[CHAIN])
        step = chain.pop()
        raw = step_message(step, [result], headers.get("celery_queue", ""), headers, chain)
        self.publish(raw, unique_key(raw.task_id))

    def _chord_part(self, headers: Mapping[str, str], document: Mapping[str, Any]) -> None:
        group, body = headers[GROUP], json.loads(headers[CHORD])
        part = json.dumps({"id": headers.get("celery_id", ""), "status": document["status"],
                           "result": document.get("result")})
        callback = body["options"]["task_id"]
        parts = self.backend.call(lambda client: join(
            client, JOIN_KEY.format(group=group), group, int(headers[GROUP_INDEX]), part))
        if parts is None:
            return
        failed = [p for p in parts if p["status"] != "SUCCESS"]
        if failed:
            self.backend.store(chord_error(callback, failed[0]))
            return
        raw = step_message(body, [[p["result"] for p in parts]],
                           headers.get("celery_queue", ""), headers)
        self.publish(raw, unique_key(raw.task_id))


def join(client: redis.Redis, key: str, group: str, index: int, part: str) -> list[Any] | None:
    """Record one member's `part` (JSON) in hash `key`, once per member; every member's, in
    group order, when this completed the group, else None.

    The size is what the producer wrote, and Celery writes it just before it sends the
    group's last member: members that end (or arrive) before it was written only count
    (as in Celery's own join), and the last member, or whichever comes after, completes
    it. A producer whose size never reaches this Redis (another result backend) leaves the
    chord waiting, as a Celery worker would."""
    with client.pipeline() as pipe:
        pipe.hsetnx(key, str(index), part)
        pipe.expire(key, KEPT)
        pipe.hlen(key)
        pipe.get(SIZE_KEY.format(group=group))
        _, _, count, size = pipe.execute()
    if size is None or int(count) < int(size):
        return None
    found = client.hgetall(key)
    return [json.loads(found[k]) for k in sorted(found, key=int)]


def chord_error(callback_id: str, culprit: Mapping[str, Any]) -> dict[str, Any]:
    """The callback's FAILURE when a member failed, as Celery's backend writes it."""
    exc = culprit.get("result") or {}
    shown = ", ".join(repr(a) for a in exc.get("exc_message") or [])
    reason = f"Dependency {culprit['id']} raised {exc.get('exc_type', 'Exception')}({shown})"
    return meta(callback_id, "FAILURE", exception("ChordError", reason, "celery.exceptions"))


def unique_key(task_id: str) -> str:
    """The key a follow-up is published under: its Celery task id."""
    return f"celery-canvas:{task_id}"


def publish_step(client: Client, lookup: Callable[[str], Task[Any, Any] | None],
                 reply_to: str, raw: CeleryMessage, key: str) -> None:
    """Publish a follow-up into Conveyor as the feed publishes what it takes, but once per
    `key`; one the intake refuses goes to the rejects queue, as the feed's do."""
    outcome = convert(raw, intake_queue(raw.queue), lookup, time.time(), reply_to)
    if not isinstance(outcome, Accepted):
        client.broker.publish_many([publication(raw, client, lookup, reply_to)])
        return
    # Held under a token of this publish, not the message id (`Client.enqueue`'s holder):
    # a second publish of the same Celery task has the same id, and must see it is one.
    # First for PUBLISHING seconds only: killed before the publish, this follower leaves a
    # key that lapses before the outcome is delivered again (the broker's lease, 60 s), so
    # the redelivery publishes it (nothing lost); once published, the key is held a day.
    token = new_id()
    limiter = client.limiter()
    if limiter.hold(key, token, time.time(), PUBLISHING) != token:
        log.info("Celery task %s (%s) was published already: not again", raw.task_id,
                 raw.task_name)
        return
    try:
        client.enqueue(outcome.message, outcome.delay)
    except BaseException:
        limiter.unhold(key, token)   # not published: the next try may
        raise
    limiter.unhold(key, token)       # the limiter cannot extend a hold: take it again
    limiter.hold(key, token, time.time(), KEPT)
