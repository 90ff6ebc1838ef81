"""The rest schedule of an idle consumer on the embedded broker (streams/idle.py), on a fake clock."""

from __future__ import annotations

import pytest

from streams.idle import MIN_REST_S, IdleRest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_idle_rest__half_the_quiet_time_up_to_the_max() -> None:
    clock = Clock()
    rest = IdleRest(1.0, clock)
    assert rest.rest_s() == 0.0  # just started: fetch at once
    clock.now += 1.5 * MIN_REST_S  # a rest under the minimum is not taken
    assert rest.rest_s() == 0.0
    clock.now += 0.8
    assert rest.rest_s() == pytest.approx((0.8 + 1.5 * MIN_REST_S) / 2)
    clock.now += 60
    assert rest.rest_s() == 1.0


def test_idle_rest__a_record_ends_the_quiet_an_empty_consume_does_not() -> None:
    clock = Clock()
    rest = IdleRest(1.0, clock)
    clock.now += 10
    rest.saw(0)
    assert rest.rest_s() == 1.0
    rest.saw(3)
    assert rest.rest_s() == 0.0
    clock.now += 10
    rest.reset()  # a rebalance: the new partitions are fetched at once
    assert rest.rest_s() == 0.0


def test_idle_rest__a_max_of_zero_never_rests() -> None:
    clock = Clock()
    rest = IdleRest(0.0, clock)
    clock.now += 3600
    assert rest.rest_s() == 0.0
