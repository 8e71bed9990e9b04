"""The envelope: round trips, every rejection path, signing."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.message import Codec, Message, MessageError, canonical_bytes, messages_equal, new_id

json_scalars = st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=10)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    is_command = draw(st.booleans())
    return Message(
        queue=draw(st.text(min_size=1, max_size=20)),
        task="" if is_command else draw(st.text(min_size=1, max_size=30)),
        command=tuple(draw(st.lists(st.text(max_size=10), min_size=1, max_size=4)))
        if is_command else (),
        args=tuple(draw(st.lists(json_values, max_size=4))),
        kwargs=draw(st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
        priority=draw(st.integers(0, 255)),
        attempt=draw(st.integers(1, 100)),
        time_limit=draw(st.floats(0, 1e6)),
        memory_limit=draw(st.integers(0, 2**40)),
        reply_to=draw(st.text(max_size=10)),
        headers=draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)),
    )


@given(messages())
def test_round_trip(message: Message) -> None:
    codec = Codec()
    assert messages_equal(codec.decode(codec.encode(message)), message)


@given(messages())
def test_signed_round_trip(message: Message) -> None:
    codec = Codec(signing_key="k")
    assert messages_equal(codec.decode(codec.encode(message)), message)


def test_ids_are_unique_and_sort_by_time() -> None:
    early, late = new_id(1_000.0), new_id(2_000.0)
    assert len(early) == 26 and early < late
    assert len({new_id() for _ in range(1000)}) == 1000


def body(**overrides: object) -> bytes:
    fields = json.loads(Codec().encode(Message(queue="q", task="t")))
    fields.update(overrides)
    return json.dumps({k: v for k, v in fields.items() if v is not ...}).encode()


REJECTIONS = [
    (b"\x80\x04not json", "not JSON"),
    (pickle.dumps({"task": "t"}), "not JSON"),
    (b"[1, 2]", "JSON list, expected an object"),
    (body(id=...), "missing the field 'id'"),
    (body(queue=3), "field 'queue' is int, expected str"),
    (body(attempt=True), "field 'attempt' is bool"),
    (body(args={"a": 1}), "field 'args' is dict, expected list"),
    (body(v=2), "version 2 is unknown"),
    (body(surprise=1), "unknown fields ['surprise']"),
    (body(command=["ls", 3], task=""), "list of strings"),
    (body(headers={"a": 1}), "map strings to strings"),
    (body(task=""), "exactly one of a task name or a command"),
]


# Ids from what each case says: a body holds a fresh id and time, and xdist's workers must
# collect the same names.
@pytest.mark.parametrize("raw, says", REJECTIONS, ids=[says for _, says in REJECTIONS])
def test_rejections_say_what_is_wrong(raw: bytes, says: str) -> None:
    with pytest.raises(MessageError, match=None) as info:
        Codec().decode(raw)
    assert says in str(info.value)


def test_oversized_body_is_rejected_both_ways() -> None:
    codec = Codec(max_bytes=200)
    with pytest.raises(MessageError, match="over the 200-byte cap"):
        codec.encode(Message(queue="q", task="t", args=("x" * 300,)))
    with pytest.raises(MessageError, match="over the 200-byte cap"):
        codec.decode(b" " * 201)


def test_unsigned_message_is_rejected_when_a_key_is_set() -> None:
    unsigned = Codec().encode(Message(queue="q", task="t"))
    with pytest.raises(MessageError, match="unsigned"):
        Codec(signing_key="secret").decode(unsigned)


def test_tampered_message_is_rejected() -> None:
    signed = Codec(signing_key="secret").encode(Message(queue="q", task="t", args=(1,)))
    tampered = signed.replace(b'"args":[1]', b'"args":[2]')
    assert tampered != signed
    with pytest.raises(MessageError, match="signature does not match"):
        Codec(signing_key="secret").decode(tampered)
    with pytest.raises(MessageError, match="signature does not match"):
        Codec(signing_key="other").decode(signed)


def test_signature_is_checked_before_fields_are_trusted() -> None:
    """A forged message with a bad schema fails on its signature, not its fields."""
    with pytest.raises(MessageError, match="unsigned"):
        Codec(signing_key="secret").decode(b'{"v": 99, "queue": 1}')


def test_canonical_encoding_is_length_prefixed() -> None:
    assert canonical_bytes({"a": "bc"}) != canonical_bytes({"ab": "c"})
    assert canonical_bytes({"a": 1, "sig": "x"}) == canonical_bytes({"a": 1})


def test_a_body_never_carries_the_brokers_delivery_count() -> None:
    """The count is the broker's (copied in on each delivery): a retry's body written with
    the count of the delivery before would contradict the dead letter it may become."""
    retried = replace(Message(queue="q", task="t.x"), deliveries=3).next_attempt()
    body = Codec().encode(retried)
    assert b"deliveries" not in body
    assert (Codec().decode(body).attempt, Codec().decode(body).deliveries) == (2, 0)


def test_expires_round_trips_and_says_when_it_passed() -> None:
    m = Message(queue="q", task="t", enqueued_at=100.0, expires=130.0)
    back = Codec().decode(Codec().encode(m))
    assert back.expires == 130.0
    assert not back.expired(129.9) and back.expired(130.0)
    assert not Message(queue="q", task="t").expired(1e12)   # 0: never expires


def test_queued_again_gives_the_same_time_to_start_from_now() -> None:
    m = Message(queue="q", task="t", enqueued_at=100.0, expires=130.0)
    again = m.queued_again(500.0)
    assert (again.enqueued_at, again.expires) == (500.0, 530.0)
    assert again.queued_again(900.0).expires == 930.0   # the window does not grow
    assert Message(queue="q", task="t").queued_again(500.0).expires == 0.0
