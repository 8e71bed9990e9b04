"""Dead letters: what each one is (queue, task, reason) and a safe preview of its body."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from conveyor.broker import Administrator, DeadLetter
from conveyor.errors import MessageError
from conveyor.message import Codec
from conveyor.scheduler.runs import iso

#: Dead letters read per queue (a requeue of more goes in rounds).
SCAN = 100_000
#: A text body longer than this (in characters) is cut on a terminal; `--raw` prints it all.
TEXT_PREVIEW = 16 * 1024
#: How many bytes of a binary body a preview shows in hex.
HEX_PREVIEW = 256


def select(broker: Administrator, queue: str, ids: Collection[str] = (), reason: str = "",
           limit: int = SCAN) -> list[DeadLetter]:
    """The queue's dead letters with one of `ids` (any, when empty) whose reason contains
    `reason` (case-insensitive)."""
    wanted, text = set(ids), reason.lower()
    return [d for d in broker.dead_letters(queue, limit=limit)
            if (not wanted or d.id in wanted) and text in d.reason.lower()]


def requeue(broker: Administrator, queue: str, dead: Sequence[DeadLetter] | None, codec: Codec,
            *, fresh: bool = False) -> tuple[int, int]:
    """Each one (None: all of the queue's) back on its queue; (requeued, of them unreadable).

    A message with an `expires` is published again with its time to start counted from now
    (`Message.queued_again`, as a parked or given-back message is): requeued as it was, an
    expired one would be dead-lettered `expired` again at once, and an operator who requeues
    it wants it to run. `fresh` also starts it again at attempt 1 (a fresh retry budget).
    Either is a new publish, then the dead letter deleted (a crash in between leaves both:
    at least once). The rest, and bodies `codec` cannot read (not a message, or unsigned
    under a signing key), go back as they were, keeping their attempt count."""
    changed, as_was, unreadable, now = [], [], 0, time.time()
    for letter in dead if dead is not None else broker.dead_letters(queue, limit=SCAN):
        try:
            message = codec.decode(letter.body)
        except MessageError:
            as_was.append(letter.id)
            unreadable += 1
            continue
        if not (fresh or message.expires):
            as_was.append(letter.id)
            continue
        again = message.queued_again(now) if message.expires else message
        again = replace(again, attempt=1) if fresh else again
        broker.publish(queue, codec.encode(again), priority=again.priority)
        changed.append(letter.id)
    done = broker.purge_dead(queue, changed) if changed else 0
    kept = broker.requeue_dead(queue, as_was) if as_was else 0
    return done + kept, unreadable


def summary(dead: DeadLetter) -> dict[str, Any]:
    """The row a list shows: ids, queue, task (or command), deliveries, when and why."""
    body = parsed(dead.body)
    label = body.get("task") or " ".join(body.get("command") or []) if body else ""
    return {"id": dead.id, "queue": dead.queue, "task": label or "?",
            "message_id": body.get("id", "") if body else "",
            "deliveries": dead.delivery_count, "dead_at": iso(dead.dead_at),
            "reason": dead.reason}


def parsed(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is not one."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def message_id(dead: DeadLetter) -> str:
    body = parsed(dead.body)
    return str(body.get("id", "")) if body else ""


def body_preview(raw: bytes) -> list[str]:
    """What a terminal or a page may show of a body: text (JSON indented) up to
    TEXT_PREVIEW characters, else its size and its first bytes in hex; never binary, never
    megabytes."""
    text = as_text(raw)
    size = f"{len(raw):,} bytes"
    if text is None:
        shown = raw[:HEX_PREVIEW]
        return [f"body: {size}, not text; the first {len(shown)} in hex "
                "(`--raw` writes all of it, e.g. `--raw > body.bin`):", *hexdump(shown)]
    body = parsed(raw)
    if body is not None:
        text = json.dumps(body, indent=2, ensure_ascii=False)
    if len(text) <= TEXT_PREVIEW:
        return [f"body ({size}):", text]
    return [f"body ({size}), the first {TEXT_PREVIEW:,} characters:", text[:TEXT_PREVIEW],
            f"... cut: `conveyor dead-letters show ID --raw` prints all {size}"]


def as_text(raw: bytes) -> str | None:
    """`raw` as text, or None if it is not UTF-8 or holds control characters (a terminal
    would act on escape sequences)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = all(c.isprintable() or c in "\n\r\t" for c in text)
    return text if printable else None


def hexdump(data: bytes, per_line: int = 16) -> list[str]:
    """`hexdump -C` lines: offset, bytes in hex, and the printable ASCII ones."""
    lines = []
    for offset in range(0, len(data), per_line):
        chunk = data[offset:offset + per_line]
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"  {offset:08x}  {chunk.hex(' '):<{per_line * 3 - 1}}  |{ascii_}|")
    return lines
