"""What a warm send is worth: the first miss it prevents, priced by the backend's load, and when to
send it.

A live cache fills an entry on its first request anyway, so warming saves that first miss and
no more. Its worth depends on when it is sent: into the trough before a ramp it is nearly free;
into a flat busy hour it saves nothing. So a plan covers a span of hours: the hours a send may
go out in (`Prices.sends`, from the earliest that still keeps the entry alive to the window's
end, to the window's start), then the window. Per span hour k, with the entry's expected
requests λ_k (Poisson arrivals) and a send in hour s (at its start):

1. P_k(s) = exp(-Σ_{s<=j<k} λ_j) · (1 - exp(-λ_k)) for k >= s, 0 before: the chance the first
   ask after the send falls in hour k; Σ_k P_k(s) = 1 - exp(-Σ_{k>=s} λ_k) is the chance it is
   asked at all. An entry cached until inside the span is asked "first" only after it expires:
   hours before are left out, the hour holding the expiry counts by the fraction after it
   (`after_expiry`);
2. price(h) = idle + (1 - idle) · min(1, load(h) / peak), load the forecast requests of hour h
   over every namespace the plan reads and peak the busiest hour the history holds: a GPU-ms
   at idle costs `idle` of one at peak;
3. value(s) = Σ_k P_k(s) · (miss_cost · price(k) + latency_weight · miss_latency) - warm_cost ·
   price(s);
4. the send goes out in the hour s* of `sends` with the highest value (the earliest of equals).
   Sending later costs more once the ramp begins; sending earlier spends the warm on the
   trough's own asks, which would have filled the entry cheaply and kept it for the peak. So
   before a ramp the best hour is the last cheap one.

miss_latency is what the query's misses took end to end, as the request log says (the
profile keeps it per query beside the GPU ms); it carries no price: a caller waits as long at
night as at peak. Without a figure (a profile row from before it was kept) the miss's GPU ms
stand in for it.

When it is sent, the shadow warmer prices the send again at the load the backend shows then
(`Worth`, throttle.Aimd.load: its latency per token over the run's baseline, and its 429s): a
warm that paid at the forecast load of the send hour but not at a busy backend's is left out.

On a flat load with latency_weight 0 no warm pays (P < 1 at the same price as the send: the
miss would cost the same GPU at the same price); before a ramp-up (an idle send hour, a busy
window) a hot entry does; a one-off (λ tiny, P tiny) never does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from schemas.errors import ConfigError

# "hits": every expected hit x its miss cost (hotset.py); "prevented": the miss, as above.
ValueModel = Literal["hits", "prevented"]


def first_ask(rates: Sequence[float] | np.ndarray) -> np.ndarray:
    """P_k: the chance the first request falls in hour k, for hourly Poisson rates λ_k."""
    lam = np.asarray(rates, dtype=float)
    before = np.concatenate(([0.0], np.cumsum(lam)[:-1]))
    out: np.ndarray = np.exp(-before) * -np.expm1(-lam)
    return out


def after_expiry(hours: int, expires_h: float) -> np.ndarray:
    """Per span hour, the fraction of it after an expiry `expires_h` hours past the span's
    start: 0 before, the remainder of the hour holding it, 1 after."""
    out: np.ndarray = np.clip(np.arange(1, hours + 1, dtype=float) - expires_h, 0.0, 1.0)
    return out


def price_at(load: float, idle: float) -> float:
    """The price of a GPU-ms at `load` (0 idle .. 1 full), 1.0 at full load."""
    return idle + (1.0 - idle) * min(1.0, max(0.0, load))


@dataclass(frozen=True)
class Prices:
    """The price of a GPU-ms in each hour of a plan's span, 1.0 at peak load; `sends`: the span
    hours a send may go out in, earliest first; `start`: the window's first hour in the span
    (the hours before it are lead hours: a send there serves their asks too)."""

    hours: tuple[float, ...]
    sends: tuple[int, ...] = (0,)
    start: int = 0
    # the share of each span hour still to come (the hour under way is partly gone: its asks
    # so far can no longer be prevented); None: all of each
    ahead: tuple[float, ...] | None = None
    # what the prices were made of (from_load): each hour's load, the peak's, the idle price
    load: tuple[float, ...] | None = None
    peak: float = 0.0
    idle: float = 0.0

    def __post_init__(self) -> None:
        if not self.hours:
            raise ConfigError("prices: a span of at least one hour")
        if not self.sends or any(not 0 <= s < len(self.hours) for s in self.sends):
            raise ConfigError(f"prices: send hours {self.sends} outside the span")
        if not 0 <= self.start < len(self.hours):
            raise ConfigError(f"prices: window start {self.start} outside the span")
        if self.ahead is not None and len(self.ahead) != len(self.hours):
            raise ConfigError("prices: one share ahead per span hour")

    @classmethod
    def from_load(
        cls,
        load: Sequence[float] | np.ndarray,
        peak: float,
        idle: float,
        sends: Sequence[int] = (0,),
        start: int = 0,
        ahead: Sequence[float] | None = None,
    ) -> Prices:
        if not 0.0 <= idle <= 1.0:
            raise ConfigError(f"idle price must lie in [0, 1], got {idle}")
        lam = np.asarray(load, dtype=float)
        util = lam / peak if peak > 0 else np.zeros_like(lam)
        prices = tuple(price_at(float(u), idle) for u in util)
        return cls(
            prices, tuple(sends), start, None if ahead is None else tuple(ahead),
            tuple(float(x) for x in lam), peak, idle,
        )  # fmt: skip

    def with_extra(self, extra: Sequence[float] | np.ndarray) -> Prices:
        """The prices with `extra` load added to each hour (the sends planned there already)."""
        if self.load is None:
            return self
        load = np.asarray(self.load) + np.asarray(extra, dtype=float)
        return Prices.from_load(load, self.peak, self.idle, self.sends, self.start, self.ahead)

    @property
    def window(self) -> tuple[float, ...]:
        return self.hours[self.start :]


@dataclass(frozen=True)
class Worth:
    """What one warm send saves (the prevented miss, at peak price) and what it costs, so the
    warmer can price it again at the load the backend shows when it is sent."""

    saved_ms: float
    warm_cost_ms: float

    def value_at(self, price: float) -> float:
        return self.saved_ms - self.warm_cost_ms * price


@dataclass(frozen=True)
class Prevented:
    """A warm valued by the miss it prevents, in GPU-ms at peak price, sent in its best hour."""

    p_asked: float  # Σ P_k(s*): the chance the entry is asked after its send (and any expiry)
    price_window: float  # the P-weighted mean price of the hours it is first asked in
    price_send: float  # price(s*)
    saved_ms: float  # Σ P_k(s*) · (the prevented miss's value at k): the ranking key
    value_ms: float  # saved_ms - warm cost x price_send
    send: int = 0  # s*: the span hour it goes out in
    value_first_ms: float = 0.0  # value(s) of the earliest send hour (for "why not now")


def prevented(
    rates: Sequence[float] | np.ndarray,
    miss_cost_ms: float,
    warm_cost_ms: float,
    prices: Prices,
    latency_weight: float = 0.0,
    after: np.ndarray | None = None,
    miss_latency_ms: float | None = None,
) -> Prevented:
    """The value of warming an entry asked at `rates` per span hour, sent in its best hour of
    prices.sends (steps 3-4 above); `after`: the fraction of each hour that counts
    (after_expiry), all of it when None; a miss's latency None: its GPU ms stand in (module
    docstring). One backward pass over the span: value(s) for every s at once."""
    lam = np.asarray(rates, dtype=float)
    if after is not None:
        lam = lam * after
    if prices.ahead is not None:
        lam = lam * np.asarray(prices.ahead)
    price = prices.hours
    latency = miss_cost_ms if miss_latency_ms is None else miss_latency_ms
    n = len(price)
    # from the span's end back: saved(s) = q_s · c_s + e^-λ_s · saved(s+1), the same for the
    # chance of an ask and its price-weighted sum
    saved, asked, priced = [0.0] * (n + 1), [0.0] * (n + 1), [0.0] * (n + 1)
    for k in range(n - 1, -1, -1):
        lk = float(lam[k]) if k < len(lam) else 0.0
        q, stay = -math.expm1(-lk), math.exp(-lk)
        saved[k] = q * (miss_cost_ms * price[k] + latency_weight * latency) + stay * saved[k + 1]
        asked[k] = q + stay * asked[k + 1]
        priced[k] = q * price[k] + stay * priced[k + 1]
    best = max(prices.sends, key=lambda s: (saved[s] - warm_cost_ms * price[s], -s))
    p = asked[best]
    mean = priced[best] / p if p > 0 else sum(prices.window) / len(prices.window)
    first = prices.sends[0]
    return Prevented(
        p, mean, price[best], saved[best], saved[best] - warm_cost_ms * price[best], best,
        saved[first] - warm_cost_ms * price[first],
    )  # fmt: skip
