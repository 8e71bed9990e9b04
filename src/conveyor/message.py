"""The message envelope: versioned JSON on the wire, never pickle.

A `Message` is the unit of work a broker carries. `Codec` turns it into bytes and back,
strictly: every field is type-checked on the way in, the body size is capped, and with a
signing key configured a message without a valid HMAC-SHA256 is rejected before any of its
fields is looked at. One exception type, `MessageError`, says what was wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from typing import Any

from conveyor.errors import ConfigError, MessageError

VERSION = 1
DEFAULT_MAX_BYTES = 1024 * 1024
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(now: float | None = None) -> str:
    """A 26-character ULID: 48 bits of milliseconds then 80 random bits, sortable by time."""
    ms = int((time.time() if now is None else now) * 1000)
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


@dataclass(frozen=True)
class Message:
    """One unit of work: a registered task (`task`) or a shell command (`command`)."""

    queue: str
    task: str = ""
    command: tuple[str, ...] = ()
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    priority: int = 0
    attempt: int = 1
    deliveries: int = 0
    enqueued_at: float = field(default_factory=time.time)
    not_before: float = 0.0
    #: Wall-clock time by which it must have started (0: never): a worker acks a message
    #: past it unrun and reports it `expired` (Celery's `expires`). The scheduler stamps
    #: each DAG attempt with it, so an attempt it timed out can never start.
    expires: float = 0.0
    time_limit: float = 0.0
    soft_time_limit: float = 0.0
    memory_limit: int = 0
    max_retries: int = -1
    reply_to: str = ""
    trace_id: str = ""
    run_id: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.task) == bool(self.command):
            raise MessageError(
                f"message {self.id}: give exactly one of a task name or a command "
                f"(got task={self.task!r}, command={list(self.command)!r})"
            )

    @property
    def label(self) -> str:
        """What the message runs, for logs: the task name or the command line."""
        return self.task or " ".join(self.command)

    @property
    def log_words(self) -> str:
        """`task=… id=… attempt=… run=…` for a log line about it. `run` is the DAG run's id,
        the one `conveyor runs list` shows and `runs show` takes (a DAG task's `run_id` field
        is its task instance and attempt, which no command takes); else its own run_id."""
        run = self.headers.get("run") or self.run_id
        return f"task={self.label} id={self.id} attempt={self.attempt}" + (
            f" run={run}" if run else "")

    def expired(self, now: float) -> bool:
        """Whether its deadline to start (`expires`) passed at `now`."""
        return 0.0 < self.expires <= now

    def queued_again(self, now: float) -> Message:
        """The same message queued again at `now` (handed a slot after it was parked, or
        given back by a stopping worker): the time it was given to start, `expires` minus
        `enqueued_at`, starts over, as the scheduler's queued timeout does."""
        if not self.expires:
            return replace(self, enqueued_at=now)
        return replace(self, enqueued_at=now,
                       expires=now + max(0.0, self.expires - self.enqueued_at))

    def next_attempt(self) -> Message:
        """The same work, one attempt later (a retry after a task fault)."""
        return replace(self, attempt=self.attempt + 1)


def deadline(expires: float | datetime, now: float, delay: float = 0.0) -> float:
    """`Message.expires` for an `expires=` given on enqueue: seconds from `now` (as Celery's
    `expires=60`), or a time (a naive datetime is UTC, as Celery reads one). It must come
    after `delay`, else the message would expire before it may run: that is a mistake to
    say at once, not a dead letter to find later."""
    if isinstance(expires, datetime):
        moment = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
        at = moment.timestamp()
    elif isinstance(expires, int | float) and not isinstance(expires, bool) and expires > 0:
        at = now + expires
    else:
        raise ConfigError(f"expires={expires!r}: give seconds from now (a number above 0) or "
                          "a datetime")
    if at <= now + delay:
        raise ConfigError(f"expires={expires!r} is not after the delay ({delay:g} s from "
                          "now): the message would expire before it may run")
    return at


# name -> (accepted JSON types, required)
_SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    "v": ((int,), True),
    "id": ((str,), True),
    "queue": ((str,), True),
    "task": ((str,), False),
    "command": ((list,), False),
    "args": ((list,), False),
    "kwargs": ((dict,), False),
    "priority": ((int,), False),
    "attempt": ((int,), False),
    "deliveries": ((int,), False),
    "enqueued_at": ((int, float), True),
    "not_before": ((int, float), False),
    "expires": ((int, float), False),
    "time_limit": ((int, float), False),
    "soft_time_limit": ((int, float), False),
    "memory_limit": ((int,), False),
    "max_retries": ((int,), False),
    "reply_to": ((str,), False),
    "trace_id": ((str,), False),
    "run_id": ((str,), False),
    "headers": ((dict,), False),
    "sig": ((str,), False),
}


def canonical_bytes(fields: Mapping[str, Any]) -> bytes:
    """Length-prefixed encoding of every field but `sig`, in name order, for signing.

    Each name and each JSON-encoded value is preceded by its length, so no two different
    messages can produce the same bytes by shifting text between fields.
    """
    out = bytearray()
    for name in sorted(k for k in fields if k != "sig"):
        value = json.dumps(fields[name], sort_keys=True, separators=(",", ":")).encode()
        for part in (name.encode(), value):
            out += len(part).to_bytes(4, "big") + part
    return bytes(out)


class Codec:
    """Encodes and strictly decodes messages; signs and verifies when given a key."""

    def __init__(self, signing_key: bytes | str | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(signing_key, str):
            signing_key = signing_key.encode()
        self._key = signing_key or None
        self.max_bytes = max_bytes

    def encode(self, message: Message) -> bytes:
        fields = _to_fields(message)
        if self._key:
            fields["sig"] = self._sign(fields)
        body = json.dumps(fields, separators=(",", ":")).encode()
        if len(body) > self.max_bytes:
            raise MessageError(
                f"message {message.id} for {message.label!r} is {len(body)} bytes, over the "
                f"{self.max_bytes}-byte cap: pass large data by reference (a path or URL)"
            )
        return body

    def decode(self, body: bytes) -> Message:
        if len(body) > self.max_bytes:
            raise MessageError(f"message is {len(body)} bytes, over the {self.max_bytes}-byte cap")
        try:
            fields = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MessageError(f"message is not JSON ({exc}): was it pickled by another "
                               "producer?") from None
        if not isinstance(fields, dict):
            raise MessageError(f"message is JSON {type(fields).__name__}, expected an object")
        if self._key:
            self._verify(fields)
        _check_schema(fields)
        return _from_fields(fields)

    def _sign(self, fields: Mapping[str, Any]) -> str:
        assert self._key is not None
        return hmac.new(self._key, canonical_bytes(fields), hashlib.sha256).hexdigest()

    def _verify(self, fields: Mapping[str, Any]) -> None:
        sig = fields.get("sig")
        if not isinstance(sig, str):
            raise MessageError("message is unsigned but a signing key is configured")
        if not hmac.compare_digest(sig, self._sign(fields)):
            raise MessageError("message signature does not match: tampered, or signed with "
                               "another key")


def _to_fields(message: Message) -> dict[str, Any]:
    """The body's fields. `deliveries` is left out: the broker counts deliveries and the
    worker copies its count in on each one, so a count written into a body (a retry's) would
    be stale by the next delivery, and a dead letter's body would contradict its metadata."""
    out: dict[str, Any] = {"v": VERSION}
    for name in _FIELD_NAMES:   # not asdict(): it deep-copies every value only to encode it
        out[name] = getattr(message, name)
    out["command"] = list(message.command)
    out["args"] = list(message.args)
    out["kwargs"] = dict(message.kwargs)
    out["headers"] = dict(message.headers)
    return out


_FIELD_NAMES = tuple(f.name for f in dataclass_fields(Message) if f.name != "deliveries")


def _check_schema(fields: Mapping[str, Any]) -> None:
    if fields.get("v") != VERSION and isinstance(fields.get("v"), int):
        raise MessageError(f"message version {fields['v']} is unknown; this worker reads "
                           f"version {VERSION}: upgrade the worker")
    for name, (types, required) in _SCHEMA.items():
        if name not in fields:
            if required:
                raise MessageError(f"message is missing the field {name!r}")
            continue
        value = fields[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join(t.__name__ for t in types)
            raise MessageError(f"message field {name!r} is {type(value).__name__}, "
                               f"expected {wanted}")
    unknown = sorted(set(fields) - set(_SCHEMA))
    if unknown:
        raise MessageError(f"message has unknown fields {unknown}")
    _check_items(fields)


def _check_items(fields: Mapping[str, Any]) -> None:
    command = fields.get("command", [])
    if not all(isinstance(part, str) for part in command):
        raise MessageError("message field 'command' must be a list of strings")
    headers = fields.get("headers", {})
    if not all(isinstance(v, str) for v in headers.values()):
        raise MessageError("message field 'headers' must map strings to strings")


def _from_fields(fields: Mapping[str, Any]) -> Message:
    values = {k: v for k, v in fields.items() if k not in ("v", "sig")}
    values["command"] = tuple(values.get("command", ()))
    values["args"] = tuple(values.get("args", ()))
    return Message(**values)


def messages_equal(a: Message, b: Message) -> bool:
    """Field-wise equality that treats lists and tuples alike (JSON has no tuples)."""
    return _to_fields(a) == _to_fields(b)


__all__ = ["Codec", "Message", "MessageError", "canonical_bytes", "messages_equal", "new_id"]


#: Message header listing the exit codes (comma-separated) that skip a command task.
SKIP_CODES_HEADER = "skip_exit_codes"


def skip_codes(headers: Mapping[str, str]) -> frozenset[int]:
    """The exit codes that mean skipped for a message (none without the header)."""
    text = headers.get(SKIP_CODES_HEADER, "")
    return frozenset(int(code) for code in text.split(",") if code.strip().isdigit())
