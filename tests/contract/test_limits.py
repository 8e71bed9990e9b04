"""One contract for every limiter backend (`conveyor.limits`), against the real stores.

Time is passed in (`now`), so leases lapse and buckets refill without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.flow import Spec
from conveyor.limits import Limiter, Override, Parcel, from_url
from tests.conftest import POSTGRES_URL, REDIS_URL, clean_transport, require_service

BACKENDS: dict[str, tuple[str | None, Callable[[Path, str], str]]] = {
    "sqlite": (None, lambda tmp, name: f"sqlite:///{tmp}/limits.db"),
    "redis": ("redis", lambda tmp, name: f"{REDIS_URL}?prefix={name}"),
    "postgres": ("postgres", lambda tmp, name: f"{POSTGRES_URL}?schema={name}"),
}
T0 = 1_800_000_000.0
LEASE = 10.0


@pytest.fixture(params=sorted(BACKENDS))
def open_limiter(request: pytest.FixtureRequest, tmp_path: Path,
                 unique: str) -> Iterator[Callable[[], Limiter]]:
    service, url_of = BACKENDS[request.param]
    if service:
        require_service(service)
    opened: list[Limiter] = []

    def make() -> Limiter:
        opened.append(from_url(url_of(tmp_path, unique)))
        return opened[-1]

    yield make
    for limiter in opened:
        limiter.close()
    clean_transport(request.param, unique)


@pytest.fixture
def limiter(open_limiter: Callable[[], Limiter]) -> Limiter:
    return open_limiter()


def parcel(i: int | str, queue: str = "q") -> Parcel:
    return Parcel(f"m{i}", queue, f'{{"n":"{i}"}}'.encode(), 0)


def c(key: str = "tenant:a", mx: int = 2, weight: int = 1) -> Spec:
    return Spec("c", key, max=mx, weight=weight)


def r(key: str = "api", per_second: float = 10.0, burst: int = 1) -> Spec:
    return Spec("r", key, per_second=per_second, burst=burst)


def test_at_most_max_run_and_the_rest_are_parked(limiter: Limiter) -> None:
    verdicts = [limiter.admit(parcel(i), [c()], T0, LEASE).verdict for i in range(4)]
    assert verdicts == ["run", "run", "parked", "parked"]
    usage = {u.key: u for u in limiter.usage(T0)}["tenant:a"]
    assert (usage.in_use, usage.waiting, usage.denied, usage.max) == (2, 2, 2, 2)
    assert (usage.holders, usage.limit) == (("m0", "m1"), "max 2")
    limiter.release("m0", [c()], T0 + 1, LEASE)       # its token goes to m2, the oldest parked
    assert {u.key: u for u in limiter.usage(T0 + 1)}["tenant:a"].holders == ("m1", "m2")
    assert {u.key: u for u in limiter.usage(T0 + LEASE + 2)}["tenant:a"].holders == ()


def test_a_redelivered_holder_is_admitted_again_without_counting_twice(limiter: Limiter
                                                                       ) -> None:
    for _ in range(3):
        assert limiter.admit(parcel(1), [c()], T0, LEASE).granted
    assert limiter.admit(parcel(2), [c()], T0, LEASE).granted
    assert limiter.admit(parcel(3), [c()], T0, LEASE).verdict == "parked"


def test_parking_is_once_per_message(limiter: Limiter) -> None:
    limiter.admit(parcel(1), [c(mx=1)], T0, LEASE)
    for _ in range(3):
        assert limiter.admit(parcel(2), [c(mx=1)], T0, LEASE).verdict == "parked"
    assert {u.key: u.waiting for u in limiter.usage(T0)}["tenant:a"] == 1


def test_park_many_parks_those_whose_key_is_full_and_grants_nothing(limiter: Limiter
                                                                    ) -> None:
    assert limiter.admit(parcel(0), [c(mx=1)], T0, LEASE).granted
    items = [(parcel(1), [c(mx=1)]), (parcel(2), [c("tenant:b", mx=1)]),
             (parcel(0), [c(mx=1)]),  # the holder itself: never parked behind its own token
             (parcel(3), [c(mx=1), r()]), (parcel(4), [r()]), (parcel(5), [c(mx=1)])]
    assert limiter.park_many(items, T0) == ["tenant:a", "", "", "tenant:a", "", "tenant:a"]
    usage = {u.key: u for u in limiter.usage(T0)}
    assert (usage["tenant:a"].in_use, usage["tenant:a"].waiting) == (1, 3)
    assert (usage["tenant:b"].in_use, usage["tenant:b"].waiting) == (0, 0)
    assert usage["tenant:a"].denied == 3
    # left alone means untouched: m2 takes tenant:b's one token through admit, as usual
    assert limiter.admit(parcel(2), [c("tenant:b", mx=1)], T0, LEASE).granted


def test_a_batch_parked_twice_is_parked_once_in_its_first_order(limiter: Limiter) -> None:
    """A worker killed between the park and the acks: the batch comes back and is parked
    again; nothing is duplicated and the waiting order is the first one."""
    assert limiter.admit(parcel(0), [c(mx=1)], T0, LEASE).granted
    batch = [(parcel(i), [c(mx=1)]) for i in range(1, 6)]
    assert limiter.park_many(batch, T0) == ["tenant:a"] * 5
    assert limiter.park_many(batch[::-1], T0 + 1) == ["tenant:a"] * 5
    assert {u.key: u.waiting for u in limiter.usage(T0)}["tenant:a"] == 5
    assert limiter.release("m0", [c(mx=1)], T0 + 2, LEASE) == [parcel(1)]


def test_release_hands_the_token_to_the_oldest_parked_message(limiter: Limiter) -> None:
    for i in range(4):
        limiter.admit(parcel(i), [c()], T0, LEASE)
    moved = limiter.release("m0", [c()], T0 + 1, LEASE)
    assert moved == [parcel(2)]
    limiter.moved(["m2"])
    # the handed-over message is admitted at once when it comes back; the token was its own
    assert limiter.admit(parcel(2), [c()], T0 + 2, LEASE).granted
    assert limiter.admit(parcel(9), [c()], T0 + 2, LEASE).verdict == "parked"
    assert {u.key: (u.in_use, u.waiting) for u in limiter.usage(T0 + 2)}["tenant:a"] == (2, 2)


def test_a_lapsed_lease_frees_its_token_and_the_sweep_moves_the_waiting_on(limiter: Limiter
                                                                           ) -> None:
    limiter.admit(parcel(1), [c(mx=1)], T0, LEASE)
    limiter.admit(parcel(2), [c(mx=1)], T0, LEASE)
    assert limiter.sweep(T0 + LEASE / 2, LEASE) == []
    assert limiter.sweep(T0 + LEASE + 1, LEASE) == [parcel(2)]


def test_renewed_tokens_outlive_the_first_lease(limiter: Limiter) -> None:
    limiter.admit(parcel(1), [c(mx=1)], T0, LEASE)
    limiter.renew([("m1", [c(mx=1)])], T0 + LEASE - 1, LEASE)
    assert limiter.admit(parcel(2), [c(mx=1)], T0 + LEASE + 1, LEASE).verdict == "parked"
    assert limiter.sweep(T0 + LEASE + 1, LEASE) == []


def test_a_handover_never_confirmed_is_offered_again(limiter: Limiter) -> None:
    limiter.admit(parcel(1), [c(mx=1)], T0, LEASE)
    limiter.admit(parcel(2), [c(mx=1)], T0, LEASE)
    assert limiter.release("m1", [c(mx=1)], T0 + 1, LEASE) == [parcel(2)]
    assert limiter.sweep(T0 + 2, LEASE) == []
    assert limiter.sweep(T0 + LEASE + 2, LEASE) == [parcel(2)]
    limiter.moved(["m2"])
    assert limiter.sweep(T0 + 3 * LEASE, LEASE) == []
    assert {u.key: u.waiting for u in limiter.usage(T0)}.get("tenant:a", 0) == 0  # forgotten


def test_all_limits_or_none(limiter: Limiter) -> None:
    limiter.admit(parcel(1), [c("b", mx=1)], T0, LEASE)
    both = [c("a", mx=1), c("b", mx=1)]
    assert limiter.admit(parcel(2), both, T0, LEASE).verdict == "parked"
    assert limiter.admit(parcel(3), [c("a", mx=1)], T0, LEASE).granted  # m2 holds none of a


def test_weights_take_that_many_slots_of_a_pool(limiter: Limiter) -> None:
    pool = c("pool:exports", mx=3, weight=2)
    assert limiter.admit(parcel(1), [pool], T0, LEASE).granted
    assert limiter.admit(parcel(2), [pool], T0, LEASE).verdict == "parked"
    assert limiter.admit(parcel(3), [c("pool:exports", mx=3)], T0, LEASE).granted


def test_a_run_time_override_wins_and_clearing_it_restores_the_declared(limiter: Limiter
                                                                        ) -> None:
    limiter.set_limit("tenant:a", Override(max=1))
    assert limiter.admit(parcel(1), [c()], T0, LEASE).granted
    assert limiter.admit(parcel(2), [c()], T0, LEASE).verdict == "parked"
    assert {u.key: (u.max, u.overridden) for u in limiter.usage(T0)}["tenant:a"] == (1, True)
    assert limiter.clear("tenant:a") is True
    assert limiter.clear("tenant:a") is False
    assert limiter.admit(parcel(3), [c()], T0, LEASE).granted


def test_a_rate_spaces_starts_and_reservations_are_not_counted_twice(limiter: Limiter
                                                                     ) -> None:
    first = limiter.admit(parcel(1), [r()], T0, LEASE)
    second = limiter.admit(parcel(2), [r()], T0, LEASE)
    third = limiter.admit(parcel(3), [r()], T0, LEASE)
    assert first.granted
    assert (second.verdict, third.verdict) == ("delayed", "delayed")
    assert second.delay == pytest.approx(0.1, abs=1e-3)
    assert third.delay == pytest.approx(0.2, abs=1e-3)
    assert limiter.admit(parcel(2), [r()], T0 + 0.1, LEASE, rate_reserved=True).granted
    # the reservations are spent: the next free start is after the third's
    assert limiter.admit(parcel(4), [r()], T0 + 0.1, LEASE).delay == pytest.approx(0.2,
                                                                                   abs=1e-3)


def test_a_burst_starts_at_once_then_the_rate_holds(limiter: Limiter) -> None:
    verdicts = [limiter.admit(parcel(i), [r(burst=3)], T0, LEASE).verdict for i in range(4)]
    assert verdicts == ["run", "run", "run", "delayed"]
    assert limiter.admit(parcel(9), [r(burst=3)], T0 + 10, LEASE).granted  # refilled


def test_a_rate_override_changes_the_spacing(limiter: Limiter) -> None:
    limiter.set_limit("api", Override(per_second=2.0))
    limiter.admit(parcel(1), [r()], T0, LEASE)
    assert limiter.admit(parcel(2), [r()], T0, LEASE).delay == pytest.approx(0.5, abs=1e-3)
    assert {u.key: u.per_second for u in limiter.usage(T0)}["api"] == 2.0


def test_a_full_key_parks_before_any_rate_token_is_spent(limiter: Limiter) -> None:
    both = [c(mx=1), r()]
    assert limiter.admit(parcel(1), both, T0, LEASE).granted
    assert limiter.admit(parcel(2), both, T0, LEASE).verdict == "parked"
    limiter.release("m1", both, T0 + 5, LEASE)
    assert limiter.admit(parcel(2), both, T0 + 5, LEASE).granted


def test_concurrent_admissions_never_exceed_the_limit(
        open_limiter: Callable[[], Limiter]) -> None:
    granted: list[str] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        mine = open_limiter()
        for i in range(15):
            if mine.admit(parcel(f"{n}-{i}"), [c(mx=3)], T0, LEASE).granted:
                with lock:
                    granted.append(f"{n}-{i}")

    limiters = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for thread in limiters:
        thread.start()
    for thread in limiters:
        thread.join()
    assert len(granted) == 3


def test_the_broker_s_own_url_opens_its_limiter(tmp_path: Path, unique: str) -> None:
    """The default: limits beside the broker, whose URL carries options of its own."""
    from conveyor.locations import store_urls
    urls = {"sqlite": f"sqlite:///{tmp_path}/broker.db",
            "redis": f"{REDIS_URL}?prefix={unique}&retry_seconds=5&reconnect_timeout=5",
            "postgres": f"{POSTGRES_URL}?schema={unique}&ack_commit=async&retry_seconds=5"}
    for backend, broker_url in urls.items():
        if BACKENDS[backend][0]:
            require_service(str(BACKENDS[backend][0]))
        limiter = from_url(store_urls(broker_url).limits)
        try:
            assert limiter.admit(parcel(1), [c()], T0, LEASE).granted
        finally:
            limiter.close()
            clean_transport(backend, unique)
    assert store_urls("amqp://guest:guest@h/%2F", "postgresql://h/db").limits \
        == "postgresql://h/db"
    assert store_urls("amqp://h/", limits_url="redis://r/0").limits == "redis://r/0"


def keys_of(limiter: Limiter, now: float = T0) -> set[str]:
    return {u.key for u in limiter.usage(now)}


def test_an_idle_key_is_forgotten_at_release(limiter: Limiter) -> None:
    """A key made from a template (one per tenant) must not stay in the store forever."""
    one = c("tenant:x", mx=1)
    limiter.admit(parcel(1), [one], T0, LEASE)
    limiter.admit(parcel(2), [one], T0, LEASE)
    assert limiter.release("m1", [one], T0 + 1, LEASE) == [parcel(2)]
    assert "tenant:x" in keys_of(limiter)  # m2 holds the token it was handed
    limiter.moved(["m2"])
    assert limiter.admit(parcel(2), [one], T0 + 2, LEASE).granted
    assert limiter.release("m2", [one], T0 + 3, LEASE) == []
    assert "tenant:x" not in keys_of(limiter)
    assert limiter.admit(parcel(3), [one], T0 + 4, LEASE).granted  # as new, with its max
    assert limiter.admit(parcel(4), [one], T0 + 4, LEASE).verdict == "parked"


def test_the_sweep_forgets_a_key_whose_only_token_lapsed(limiter: Limiter) -> None:
    limiter.admit(parcel(1), [c("tenant:y")], T0, LEASE)
    assert limiter.sweep(T0 + 1, LEASE) == []
    assert "tenant:y" in keys_of(limiter)
    assert limiter.sweep(T0 + LEASE + 1, LEASE) == []
    assert "tenant:y" not in keys_of(limiter, T0 + LEASE + 1)


def test_a_rate_key_is_forgotten_once_its_bucket_is_full_again(limiter: Limiter) -> None:
    for i in range(3):
        limiter.admit(parcel(i), [r("api")], T0, LEASE)  # reservations until T0 + 0.3
    limiter.sweep(T0 + 0.2, LEASE)
    assert "api" in keys_of(limiter, T0 + 0.2)  # a reservation is still ahead
    limiter.sweep(T0 + 0.5, LEASE)
    assert "api" not in keys_of(limiter, T0 + 0.5)
    verdicts = [limiter.admit(parcel(i), [r("api")], T0 + 0.5, LEASE).verdict
                for i in range(5, 7)]
    assert verdicts == ["run", "delayed"]  # a full bucket again, no more


def test_a_key_waited_on_or_overridden_is_kept(limiter: Limiter) -> None:
    one = c("tenant:z", mx=1)
    limiter.admit(parcel(1), [one], T0, LEASE)
    limiter.admit(parcel(2), [one], T0, LEASE)
    limiter.sweep(T0 + LEASE + 1, LEASE)  # m1's token lapsed: m2 is handed it, not yet moved
    assert "tenant:z" in keys_of(limiter, T0 + LEASE + 1)
    limiter.set_limit("partner-api", Override(per_second=5.0))
    limiter.sweep(T0 + 3 * LEASE, LEASE)
    assert {u.key: u.per_second for u in limiter.usage(T0)}["partner-api"] == 5.0
    assert limiter.clear("partner-api")
    limiter.sweep(T0 + 3 * LEASE, LEASE)
    assert "partner-api" not in keys_of(limiter)


def test_every_redis_key_and_call_of_the_limiter_is_in_one_hash_slot(unique: str) -> None:
    """Redis Cluster runs a script only on keys of one slot: each call names its key set in
    KEYS (routing), and every key the scripts make carries the one hash tag."""
    require_service("redis")
    import redis
    from redis.crc import key_slot

    limiter = from_url(f"{REDIS_URL}?prefix={unique}")
    calls: list[list[str]] = []
    script = limiter._script  # type: ignore[attr-defined]

    def spy(keys: list[str], args: list[object]) -> object:
        calls.append(keys)
        return script(keys=keys, args=args)

    limiter._script = spy  # type: ignore[attr-defined]
    try:
        both = [c(mx=1), r()]
        limiter.admit(parcel(1), both, T0, LEASE)
        limiter.admit(parcel(2), both, T0, LEASE)
        limiter.admit(parcel(3), [r()], T0, LEASE)
        limiter.renew([("m1", both)], T0 + 1, LEASE)
        limiter.set_limit("api", Override(per_second=5.0))
        assert limiter.release("m1", both, T0 + 2, LEASE) == [parcel(2)]
        limiter.sweep(T0 + 3, LEASE)
        limiter.moved(["m2"])
        client = redis.Redis.from_url(REDIS_URL)
        try:
            names = list(client.scan_iter(match=f"{unique}:*"))
        finally:
            client.close()
        slots = {key_slot(name) for name in names} | {
            key_slot(key.encode()) for keys in calls for key in keys}
        assert len(names) >= 5 and all(calls) and len(slots) == 1, (names, calls)
    finally:
        limiter.close()
        clean_transport("redis", unique)


def test_a_unique_key_has_one_holder_until_that_holder_gives_it_back(limiter: Limiter) -> None:
    now = time.time()  # Redis keeps the time to live on its own clock
    assert limiter.hold("invoice:42", "m1", now, 60) == "m1"
    assert limiter.hold("invoice:42", "m2", now, 60) == "m1"
    limiter.unhold("invoice:42", "m2")  # not its holder: nothing changes
    assert limiter.hold("invoice:42", "m3", now, 60) == "m1"
    assert limiter.hold("invoice:43", "m3", now, 60) == "m3"  # another key is another hold
    limiter.unhold("invoice:42", "m1")
    assert limiter.hold("invoice:42", "m4", now, 60) == "m4"


def test_a_unique_key_whose_time_ran_out_goes_to_the_next_holder(limiter: Limiter) -> None:
    assert limiter.hold("report", "m1", time.time(), 0.3) == "m1"
    time.sleep(0.5)
    assert limiter.hold("report", "m2", time.time(), 60) == "m2"
    limiter.unhold("report", "m1")  # the lapsed holder's late give-back takes nothing
    assert limiter.hold("report", "m3", time.time(), 60) == "m2"


def test_a_cancel_is_recorded_once_and_listed_until_it_lapses(
        open_limiter: Callable[[], Limiter]) -> None:
    """Idempotent (the second cancel says it was there), read back by another connection,
    by the time it was made (`since`), and deleted once its time ran out."""
    limiter, other = open_limiter(), open_limiter()
    assert limiter.cancel("m1", T0, 60) is True
    assert other.cancel("m1", T0 + 1, 60) is False
    assert limiter.cancel("m2", T0 + 10, 5) is True
    assert sorted(other.cancels(T0 + 11)) == ["m1", "m2"]
    assert other.cancels(T0 + 11, since=T0 + 5) == ["m2"]
    assert other.cancels(T0 + 16) == ["m1"]  # m2's time ran out
    assert limiter.cancel("m3", T0 + 61, 60) is True  # deletes the lapsed m1 and m2
    assert limiter.cancel("m1", T0 + 61, 60) is True  # m1 is a new record now
    assert sorted(other.cancels(T0 + 62)) == ["m1", "m3"]
