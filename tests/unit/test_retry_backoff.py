"""Task retry delays (retry.py), computed by tenacity's wait_exponential_jitter."""

from __future__ import annotations

from conveyor.retry import backoff_delay


def test_without_jitter_the_delays_double_from_the_base_up_to_the_cap() -> None:
    assert [backoff_delay(n, 1.0, 5.0, jitter=False) for n in range(1, 6)] == [1, 2, 4, 5, 5]
    assert backoff_delay(0, 3.0, 300.0, jitter=False) == 3.0   # attempt 0 counts as the first


def test_jitter_adds_at_most_one_base_delay_and_never_passes_the_cap() -> None:
    third = [backoff_delay(3, 2.0, 300.0) for _ in range(200)]
    assert all(8.0 <= d <= 10.0 for d in third) and len(set(third)) > 1
    assert {backoff_delay(6, 2.0, 60.0) for _ in range(50)} == {60.0}


def test_a_huge_attempt_number_is_the_cap_not_an_overflow() -> None:
    assert backoff_delay(10_000, 0.5, 300.0) == 300.0
