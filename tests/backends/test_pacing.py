"""Token bucket, ramp and AIMD, counted on a fake clock (no wall-clock timing)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from backends.pacing import Aimd, AimdConfig, ManualClock, Ramp, TokenBucket


async def _grants_within(bucket: TokenBucket, clock: ManualClock, seconds: float) -> int:
    t0, n = clock.now(), 0
    while True:
        await bucket.acquire()
        if clock.now() - t0 > seconds:
            return n
        n += 1


@pytest.mark.parametrize("rate", [5.0, 20.0, 50.0])
def test_token_bucket__grants_rate_times_seconds(fake_clock: ManualClock, rate: float) -> None:
    bucket = TokenBucket(rate, fake_clock)
    n = asyncio.run(_grants_within(bucket, fake_clock, 10.0))
    assert rate * 10 <= n <= rate * 10 + 1  # the first grant is immediate


def test_token_bucket__rate_change_applies_to_later_grants(fake_clock: ManualClock) -> None:
    bucket = TokenBucket(20.0, fake_clock)
    first = asyncio.run(_grants_within(bucket, fake_clock, 5.0))
    bucket.set_rate(10.0)
    second = asyncio.run(_grants_within(bucket, fake_clock, 5.0))
    assert 100 <= first <= 101
    assert 49 <= second <= 51


def test_token_bucket__idle_time_buys_at_most_burst(fake_clock: ManualClock) -> None:
    bucket = TokenBucket(10.0, fake_clock, burst=3)
    fake_clock.t += 60  # a minute idle
    t0 = fake_clock.now()

    async def three() -> None:
        for _ in range(4):
            await bucket.acquire()

    asyncio.run(three())
    assert fake_clock.now() - t0 == pytest.approx(0.1)  # 3 at once, the 4th waits 1/rate


@pytest.mark.parametrize(("n", "k"), [(40, 40), (1, 7), (500, 3)])
def test_token_bucket__spend_after_the_work_lasts_exactly_k_n_over_rate(
    fake_clock: ManualClock, n: int, k: int
) -> None:
    """Paid after each batch from an empty start, k batches of n last k * n / rate: paying
    before (a full first token) would hand the first batch out free."""
    bucket = TokenBucket(100.0, fake_clock, burst=n, start=0.0)
    t0 = fake_clock.now()
    assert all(bucket.spend(n) for _ in range(k))
    assert fake_clock.now() - t0 == pytest.approx(k * n / 100.0)


def test_token_bucket__spend_saves_at_most_burst_while_idle(fake_clock: ManualClock) -> None:
    bucket = TokenBucket(10.0, fake_clock, burst=5, start=0.0)
    fake_clock.t += 60  # a minute idle is worth 5 units, not 600
    t0 = fake_clock.now()
    assert bucket.spend(5)
    assert fake_clock.now() == t0  # paid from the credit
    assert bucket.spend(5)
    assert fake_clock.now() - t0 == pytest.approx(0.5)


def test_token_bucket__spend_with_stop_set_returns_false_without_waiting(
    fake_clock: ManualClock,
) -> None:
    bucket = TokenBucket(10.0, fake_clock, start=0.0)
    stop = threading.Event()
    stop.set()
    t0 = fake_clock.now()
    assert bucket.spend(10, stop) is False
    assert fake_clock.now() == t0


def test_token_bucket__spend_waits_on_the_stop_event_in_real_time() -> None:
    """The monotonic clock waits on the event, so a purge that is told to stop wakes at once."""
    bucket = TokenBucket(1.0, start=0.0)  # 1 unit/s: a spend of 1000 would wait 1000 s
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    assert bucket.spend(1000, stop) is False


def test_token_bucket__refuses_a_start_over_burst(fake_clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="start <= burst"):
        TokenBucket(1.0, fake_clock, burst=2, start=3)


def test_ramp__from_start_to_end_fraction_capped_by_target() -> None:
    r = Ramp(target_qps=100, capacity_qps=200, start_frac=0.05, end_frac=0.20, duration_s=30)
    assert r.ceiling(0) == pytest.approx(10)
    assert r.ceiling(15) == pytest.approx(25)
    assert r.ceiling(30) == r.ceiling(1000) == pytest.approx(40)
    assert Ramp(5, 200, duration_s=30).ceiling(30) == 5


def test_aimd__halves_on_429_once_per_cooldown(fake_clock: ManualClock) -> None:
    a = Aimd(AimdConfig(cooldown_s=1.0), 20.0, fake_clock)
    for _ in range(10):  # one burst of errors
        a.on_congestion("429")
    assert a.rate == pytest.approx(10.0)
    fake_clock.t += 1.0
    a.on_congestion("429")
    assert a.rate < 10.0
    assert [b.reason for b in a.backoffs] == ["429", "429"]


def test_aimd__recovers_additively_and_never_passes_the_ceiling(fake_clock: ManualClock) -> None:
    cfg = AimdConfig(increase_frac_per_s=0.1, baseline_samples=1)
    a = Aimd(cfg, 20.0, fake_clock)
    a.on_congestion("429")
    assert a.rate == pytest.approx(10.0)
    seen = []
    for _ in range(100):  # 10 fake seconds of healthy answers at a steady latency
        fake_clock.t += 0.1
        a.on_success(latency_ms=50, tokens_out=10)
        seen.append(a.rate)
    assert seen[9] == pytest.approx(12.0)  # +2 QPS per second (10% of the ceiling)
    assert max(seen) == pytest.approx(20.0)
    assert all(x <= 20.0 for x in seen)


def test_aimd__backs_off_when_latency_rises_above_its_baseline(fake_clock: ManualClock) -> None:
    a = Aimd(AimdConfig(baseline_samples=5, latency_factor=1.5), 20.0, fake_clock)
    for _ in range(5):
        fake_clock.t += 0.1
        a.on_success(latency_ms=100, tokens_out=10)  # 10 ms per token
    assert a.baseline == pytest.approx(10.0)
    assert not a.backoffs
    for _ in range(10):
        fake_clock.t += 0.1
        a.on_success(latency_ms=300, tokens_out=10)  # 3x slower per token
    assert a.backoffs and a.backoffs[0].reason == "latency"
    assert a.rate < 20.0


def test_aimd__load_reads_latency_over_baseline_and_congestion_as_full(
    fake_clock: ManualClock,
) -> None:
    a = Aimd(AimdConfig(baseline_samples=3, latency_factor=1.5, busy_hold_s=5.0), 20.0, fake_clock)
    assert a.load() is None  # no baseline yet: the caller keeps the plan's price
    for _ in range(3):
        fake_clock.t += 0.1
        a.on_success(latency_ms=100, tokens_out=10)
    assert a.load() == pytest.approx(0.0)
    a.on_success(latency_ms=200, tokens_out=10)  # EWMA 0.2: 10 -> 12 ms per token
    assert a.load() == pytest.approx((12 / 10 - 1) / 0.5)
    a.on_congestion("429")
    assert a.load() == 1.0
    fake_clock.t += 4.9
    assert a.load() == 1.0  # held for busy_hold_s
    fake_clock.t += 0.2
    assert a.load() == pytest.approx(0.4)  # then the latency speaks again


def test_aimd__never_below_the_floor(fake_clock: ManualClock) -> None:
    a = Aimd(AimdConfig(min_qps=0.5, cooldown_s=0), 8.0, fake_clock)
    for _ in range(20):
        fake_clock.t += 0.001
        a.on_congestion("unavailable")
    assert a.rate == pytest.approx(0.5, rel=0.05)


def test_aimd__lower_ceiling_clips_at_once(fake_clock: ManualClock) -> None:
    a = Aimd(AimdConfig(), 20.0, fake_clock)
    assert a.set_ceiling(5.0) == 5.0
    fake_clock.t += 100
    assert a.set_ceiling(30.0) == pytest.approx(30.0)  # it stayed at the ceiling: follows it


def test_aimd__one_slow_answer_is_not_congestion(fake_clock: ManualClock) -> None:
    a = Aimd(AimdConfig(baseline_samples=5, latency_patience=3), 20.0, fake_clock)
    for lat in [100, 100, 100, 100, 100, 900, 100, 100, 100, 100]:
        fake_clock.t += 0.1
        a.on_success(latency_ms=lat, tokens_out=10)
    assert not a.backoffs
    assert a.rate == pytest.approx(20.0)


def test_aimd__follows_the_ramp_until_congestion_then_grows_back(fake_clock: ManualClock) -> None:
    a = Aimd(AimdConfig(increase_frac_per_s=0.1), 2.0, fake_clock)
    fake_clock.t += 1
    assert a.set_ceiling(4.0) == 4.0  # no congestion yet: the ramp is the plan
    a.on_congestion("429")
    assert a.rate == 2.0
    fake_clock.t += 1
    assert a.set_ceiling(6.0) == pytest.approx(2.6)  # after a cut: +10% of the ceiling per s
