"""What the autoscaler counts of ready messages that carry limits (`autoscaler.blocked`)."""

from __future__ import annotations

from conveyor.autoscaler.blocked import limits_in, runnable
from conveyor.flow import Limit, Rate, Spec, encode, resolve
from conveyor.limits import Usage
from conveyor.message import Codec, Message


def c(key: str, mx: int = 2, weight: int = 1) -> list[Spec]:
    return [Spec("c", key, max=mx, weight=weight)]


def used(key: str, in_use: int, mx: int | None = None) -> Usage:
    return Usage(key, in_use, waiting=0, denied=0, max=mx)


def test_a_full_key_lets_nothing_more_run() -> None:
    assert runnable([c("acme")] * 498, 498, {"acme": used("acme", 2, 2)}) == 0


def test_per_key_no_more_than_its_free_capacity() -> None:
    sample = [c("acme")] * 300 + [c("globex", mx=5)] * 3 + [[]] * 10
    assert runnable(sample, len(sample), {"acme": used("acme", 1, 2)}) == 1 + 3 + 10


def test_the_limit_in_force_is_the_store_s_override() -> None:
    assert runnable([c("acme")] * 50, 50, {"acme": used("acme", 2, 40)}) == 38


def test_a_message_with_two_keys_runs_only_if_both_have_room() -> None:
    both = [Spec("c", "a", max=1), Spec("c", "b", max=5)]
    assert runnable([both, both, c("b", mx=5)], 3, {}) == 2
    assert runnable([both], 1, {"b": used("b", 5, 5)}) == 0


def test_weights_take_that_many_slots() -> None:
    assert runnable([c("pool:x", mx=5, weight=2)] * 4, 4, {}) == 2


def test_beyond_the_sample_its_runnable_share_is_assumed() -> None:
    sample = [c("acme")] * 500 + [[]] * 500
    assert runnable(sample, 10_000, {"acme": used("acme", 2, 2)}) == 5_000


def test_beyond_the_sample_a_key_gives_no_more_than_its_room() -> None:
    assert runnable([c("acme")] * 1_000, 10_000, {}) == 2
    sample = [c("acme", mx=1_500)] * 1_000
    assert runnable(sample, 10_000, {}) == 1_500
    mixed = [c("acme")] * 900 + [[]] * 100
    assert runnable(mixed, 10_000, {"acme": used("acme", 2, 2)}) == 100 + 900


def test_the_header_is_read_without_the_codec_s_key() -> None:
    specs = resolve(None, [Limit("tenant:acme", max=2), Rate("api", per_second=5)], (), {})
    message = Message(queue="q", task="t", headers={"limits": encode(specs)})
    body = Codec(signing_key="secret").encode(message)
    assert limits_in(body) == [Spec("c", "tenant:acme", max=2)]  # rates never block here
    assert limits_in(b"not json") == []
    assert limits_in(Codec().encode(Message(queue="q", task="t"))) == []
