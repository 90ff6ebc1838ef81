"""The value of a warm: the first ask's hour, the price of load, the miss prevented."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.errors import ConfigError
from warmers.hotset.value import Prices, after_expiry, first_ask, prevented


def test_first_ask__matches_a_hand_computation_over_three_hours() -> None:
    # 0.5, 2 and 1 requests expected in hours 0, 1, 2 (Poisson): the first ask falls in hour k
    # when none came before it and at least one comes in it
    p = first_ask([0.5, 2.0, 1.0])
    assert p[0] == pytest.approx(1 - math.exp(-0.5))  # 0.3935
    assert p[1] == pytest.approx(math.exp(-0.5) * (1 - math.exp(-2.0)))  # 0.5244
    assert p[2] == pytest.approx(math.exp(-2.5) * (1 - math.exp(-1.0)))  # 0.0519
    assert p.sum() == pytest.approx(1 - math.exp(-3.5))  # asked at all
    assert list(first_ask([0.0, 0.0])) == [0.0, 0.0]


def test_after_expiry__counts_the_hour_holding_the_expiry_by_the_fraction_after_it() -> None:
    assert list(after_expiry(3, 1.25)) == [0.0, 0.75, 1.0]
    assert list(after_expiry(2, -0.5)) == [1.0, 1.0]  # expired before the window
    assert list(after_expiry(2, 2.0)) == [0.0, 0.0]  # outlives it


def test_prices__idle_to_peak_linear_in_load_and_capped_at_peak() -> None:
    pr = Prices.from_load([25.0, 0.0, 50.0, 100.0, 300.0], peak=100.0, idle=0.2, start=1)
    assert pr.hours == pytest.approx((0.4, 0.2, 0.6, 1.0, 1.0))
    assert pr.window == pytest.approx((0.2, 0.6, 1.0, 1.0))
    assert Prices.from_load([5.0], peak=0.0, idle=0.3).hours == (0.3,)  # no history
    with pytest.raises(ConfigError, match="idle price"):
        Prices.from_load([1.0], 1.0, idle=1.5)
    with pytest.raises(ConfigError, match="send hours"):
        Prices((0.5, 0.5), sends=(2,))


# A send hour before the window at `send`, its own asks not counted: the model of one send
# hour (span: the send hour, then the window).
def _one_send(window: tuple[float, ...], send: float) -> Prices:
    return Prices((send, *window), sends=(0,), start=1)


def test_prevented__flat_load_never_pays_a_ramp_up_does_a_one_off_never() -> None:
    flat = _one_send((1.0, 1.0), send=1.0)
    hot = prevented([0.0, 5.0, 5.0], miss_cost_ms=800, warm_cost_ms=800, prices=flat)
    assert hot.value_ms < 0  # the miss would cost the same GPU at the same price
    assert hot.p_asked == pytest.approx(1 - math.exp(-10))
    ramp = _one_send((1.0, 1.0), send=0.2)  # idle now, peak in the window
    ramped = prevented([0.0, 5.0, 5.0], 800, 800, ramp)
    assert ramped.value_ms == pytest.approx(800 * (hot.p_asked - 0.2)) and ramped.value_ms > 0
    assert prevented([0.0, 0.05, 0.05], 800, 800, ramp).value_ms < 0  # p 0.10 < the send's 0.2
    # latency, without a figure of its own, counts at the miss's GPU ms: weight 1 doubles it
    lat = prevented([0.0, 5.0, 5.0], 800, 800, flat, latency_weight=1.0)
    assert lat.saved_ms == pytest.approx(2 * hot.saved_ms) and lat.value_ms > 0


def test_prevented__a_miss_latency_is_weighted_unpriced_beside_its_gpu() -> None:
    # A miss that kept its caller waiting 3 s for 800 GPU ms (queued behind a full batch):
    # the latency term is its own 3,000 ms, at the same weight at night as at peak.
    night = _one_send((0.2, 0.2), send=0.2)
    rates = [0.0, 5.0, 5.0]
    slow = prevented(rates, 800, 800, night, latency_weight=0.5, miss_latency_ms=3_000)
    p = slow.p_asked
    assert slow.saved_ms == pytest.approx(p * (800 * 0.2 + 0.5 * 3_000))
    fast = prevented(rates, 800, 800, night, latency_weight=0.5, miss_latency_ms=100)
    assert fast.saved_ms == pytest.approx(p * (800 * 0.2 + 0.5 * 100))
    dear = _one_send((0.2, 0.2), 1.0)
    assert slow.value_ms > 0 > prevented(rates, 800, 800, dear).value_ms
    # weight 0: the latency changes nothing
    assert prevented(rates, 800, 800, night, miss_latency_ms=3_000) == prevented(
        rates, 800, 800, night
    )


def test_prevented__an_entry_expiring_in_the_window_is_valued_after_its_expiry_only() -> None:
    flat = _one_send((1.0, 1.0), send=0.2)
    whole = prevented([0.0, 3.0, 1.0], 800, 800, flat)
    late = prevented([0.0, 3.0, 1.0], 800, 800, flat, after=after_expiry(3, 1.5))
    assert late.p_asked == pytest.approx(1 - math.exp(-(1.5 + 1.0)))
    assert late.value_ms < whole.value_ms
    # Cheap now, dear later: live traffic would fill the uncached entry in the cheap hour,
    # the cached one expires into the dear one, where its first miss costs more to let happen.
    rising = _one_send((0.5, 1.0), send=0.2)
    whole, late = (prevented([0.0, 3.0, 1.0], 800, 800, rising, after=a)
                   for a in (None, after_expiry(3, 1.5)))  # fmt: skip
    p = first_ask(np.array([1.5, 1.0]))
    assert late.price_window == pytest.approx((p[0] * 0.5 + p[1] * 1.0) / p.sum())
    assert late.price_window > whole.price_window and late.value_ms > whole.value_ms


def test_prevented__the_send_goes_out_in_the_last_cheap_hour_before_the_ramp() -> None:
    # Night (idle, a few asks), a ramp, then the peak: the send may go out in any of the
    # first five hours. Sent at midnight, it is spent on the night's own asks, which live
    # traffic would fill cheaply and keep for the peak; sent on the ramp, it costs more.
    prices = Prices((0.2, 0.2, 0.2, 0.25, 0.6, 1.0, 1.0), sends=(0, 1, 2, 3, 4), start=5)
    rates = [0.3, 0.3, 0.3, 0.3, 2.0, 6.0, 6.0]
    v = prevented(rates, 800, 800, prices)
    assert v.send == 3 and v.price_send == pytest.approx(0.25)
    assert v.value_ms > v.value_first_ms > 0
    by_hand = []
    for s in prices.sends:  # value(s) from the definition, for every send hour
        p = first_ask([0.0] * s + rates[s:])
        by_hand.append(float(p @ (800 * np.asarray(prices.hours))) - 800 * prices.hours[s])
    assert v.value_ms == pytest.approx(max(by_hand)) and v.value_first_ms == pytest.approx(
        by_hand[0]
    )
    # a flat busy span: no hour pays, whichever it is
    flat = Prices((1.0,) * 4, sends=(0, 1, 2), start=3)
    assert prevented([2.0] * 4, 800, 800, flat).value_ms < 0


def test_prevented__the_hour_under_way_counts_only_what_is_left_of_it() -> None:
    # 40 minutes of the first hour are gone: its asks so far cannot be prevented any more
    prices = Prices((0.5, 1.0), sends=(0,), start=0, ahead=(1 / 3, 1.0))
    v = prevented([3.0, 1.0], 800, 800, prices)
    assert v.p_asked == pytest.approx(1 - math.exp(-(1.0 + 1.0)))
    with pytest.raises(ConfigError, match="one share ahead"):
        Prices((0.5, 1.0), ahead=(1.0,))
