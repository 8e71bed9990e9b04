"""Celery protocol 2 -> Conveyor message, table-tested on messages Celery itself builds.

`app.amqp.as_task_v2` is the function Celery's producer uses to build a message; feeding
its output through `convert` checks the mapping against real Celery, without a broker.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from conveyor.broker import from_url
from conveyor.celery_intake.conversion import Accepted, CeleryMessage, Rejected, convert
from conveyor.celery_intake.feed import Feed
from conveyor.client import Client
from conveyor.message import Codec
from conveyor.tasks import Task, TaskOptions

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
ADD = Task(lambda a, b: a + b, TaskOptions(name="t.add", max_retries=5, time_limit=99))
APP = Celery("protocol-test", broker="memory://", set_as_current=False)


def lookup(name: str) -> Task[Any, Any] | None:
    return ADD if name == "t.add" else None


def celery_message(name: str = "t.add", args: tuple[Any, ...] = (2, 3),
                   content_type: str = "application/json", body: bytes | None = None,
                   **options: Any) -> CeleryMessage:
    """What Celery's producer would put on queue `q` for `name.apply_async(args, **options)`."""
    proto = APP.amqp.as_task_v2("id-1", name, args=args, kwargs={}, now=NOW, **options)
    payload = json.dumps(proto.body).encode() if body is None else body
    return CeleryMessage(queue="q", content_type=content_type, content_encoding="utf-8",
                         headers=proto.headers, body=payload, properties=proto.properties)


def run(raw: CeleryMessage, reply_to: str = "") -> Accepted | Rejected:
    return convert(raw, "celery.q", lookup, NOW.timestamp(), reply_to)


def test_a_json_message_becomes_the_registered_task() -> None:
    out = run(celery_message(), reply_to="results")
    assert isinstance(out, Accepted) and out.delay == 0
    m = out.message
    assert (m.queue, m.task, m.args, m.id, m.attempt) == ("celery.q", "t.add", (2, 3), "id-1", 1)
    assert (m.max_retries, m.time_limit, m.reply_to) == (5, 99, "results")
    assert m.headers["celery_id"] == "id-1" and m.headers["celery_root_id"] == "id-1"


def test_a_traced_producers_context_travels_on() -> None:
    """OpenTelemetry's Celery instrumentation puts the W3C context in the message headers:
    it becomes the Conveyor message's, so the task's spans join the producer's trace."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    raw = celery_message()
    traced = replace(raw, headers={**raw.headers, "traceparent": parent, "tracestate": "k=v"})
    for message, expected in ((traced, {"traceparent": parent, "tracestate": "k=v"}),
                              (raw, {})):
        out = run(message)
        assert isinstance(out, Accepted)
        assert {k: v for k, v in out.message.headers.items() if k.startswith("trace")} \
            == expected


def test_countdown_becomes_a_delay_and_limits_and_retries_carry_over() -> None:
    out = run(celery_message(countdown=30, time_limit=20, soft_time_limit=10, retries=2))
    assert isinstance(out, Accepted)
    assert out.delay == pytest.approx(30)
    assert (out.message.time_limit, out.message.soft_time_limit) == (20, 10)
    assert out.message.attempt == 3


def test_ignore_result_sends_no_outcome_events() -> None:
    out = run(celery_message(ignore_result=True), reply_to="results")
    assert isinstance(out, Accepted) and out.message.reply_to == ""


def test_an_unregistered_task_still_goes_through_for_the_worker_to_dead_letter() -> None:
    out = run(celery_message("nobody.home"))
    assert isinstance(out, Accepted) and out.message.task == "nobody.home"


@pytest.mark.parametrize(("content_type", "named"), [
    ("application/x-python-serialize", "pickle"), ("application/x-yaml", "yaml"),
    ("application/x-msgpack", "msgpack"), ("text/plain", "an unknown serializer")])
def test_other_serializers_are_rejected_by_name_without_reading_the_body(
        content_type: str, named: str) -> None:
    body = b"\x80\x04\x95 this would be run by pickle.loads: never"
    out = run(celery_message(content_type=content_type, body=body))
    assert isinstance(out, Rejected) and out.state == "FAILURE"
    assert named in out.reason and "JSON only" in out.reason


@pytest.mark.parametrize(("options", "delay"), [
    ({"expires": NOW - timedelta(seconds=1)}, 0.0),
    ({"expires": NOW - timedelta(seconds=1), "countdown": 60}, 0.0),
    ({"expires": 10, "countdown": 60}, 60.0)])
def test_expired_messages_are_converted_for_the_worker_to_dead_letter(
        options: dict[str, Any], delay: float) -> None:
    """The intake refuses no expired message: it keeps its `expires`, and the worker
    dead-letters it `expired` as any other (one code path). Already past: delivered at once;
    passing before its eta: at its eta, when it is certainly past."""
    out = run(celery_message(**options))
    assert isinstance(out, Accepted)
    assert out.delay == pytest.approx(delay, abs=0.01)
    assert out.message.expired(NOW.timestamp() + out.delay)


def test_an_expires_still_ahead_becomes_the_messages_own() -> None:
    """The worker, not the intake, then refuses it if it waits past that time."""
    out = run(celery_message(expires=NOW + timedelta(seconds=90)))
    assert isinstance(out, Accepted)
    assert out.message.expires == pytest.approx(NOW.timestamp() + 90)
    assert not out.message.expired(NOW.timestamp() + 89)
    assert out.message.expired(NOW.timestamp() + 90)


@pytest.mark.parametrize(("body", "phrase"), [
    (b"{not json", "not valid JSON"), (b'{"task": "protocol 1"}', "[args, kwargs, embed]"),
    (json.dumps([[1], {}, {"callbacks": [{"task": "x"}], "chain": None}]).encode(),
     "link/link_error callbacks (callbacks)")])
def test_malformed_bodies_and_canvas_are_rejected(body: bytes, phrase: str) -> None:
    out = run(celery_message(body=body))
    assert isinstance(out, Rejected) and phrase in out.reason


def test_protocol_1_and_compression_are_rejected() -> None:
    bare = CeleryMessage(queue="q", content_type="application/json", content_encoding="utf-8",
                         headers={}, body=b"{}")
    assert "protocol 2" in run(bare).reason  # type: ignore[union-attr]
    zipped = celery_message()
    zipped = CeleryMessage(**{**zipped.__dict__,
                              "headers": {**zipped.headers, "compression": "application/x-gzip"}})
    assert "compressed" in run(zipped).reason  # type: ignore[union-attr]


class FakeKombuMessage:
    """What the feed reads off a kombu message, and whether it acked."""

    def __init__(self, raw: CeleryMessage) -> None:
        self.content_type, self.content_encoding = raw.content_type, raw.content_encoding
        self.headers, self.properties, self.body = raw.headers, raw.properties, raw.body
        self.acked = False

    def ack(self) -> None:
        self.acked = True


def test_a_message_conveyor_cannot_carry_is_rejected_and_acked_not_a_crash(
        tmp_path: Path) -> None:
    """Over Conveyor's size cap: a rejection record on `celery.q.rejected`, and the feed
    goes on (a crash would redeliver the same message forever)."""
    broker = from_url(f"sqlite:///{tmp_path}/broker.db")
    feed = Feed(None, ("q",), Client(broker, Codec(max_bytes=200)), lookup)  # type: ignore[arg-type]
    message = FakeKombuMessage(celery_message(args=("x" * 500, 1)))
    feed.take("q", message)  # type: ignore[arg-type]
    delivery = next(broker.consume(["celery.q.rejected"], timeout=2.0))
    assert message.acked and delivery is not None
    assert "over the 200-byte cap" in json.loads(delivery.body)["reason"]
    broker.close()
