"""What a warm send is worth: the first miss it prevents, priced by the backend's load.

A live cache fills an entry on its first request anyway, so warming saves that first miss and
no more. Per hour k of the window, with the cluster's expected requests λ_k (Poisson arrivals):

1. P_k = exp(-Σ_{j<k} λ_j) · (1 - exp(-λ_k)), the chance the first ask falls in hour k; Σ P_k
   = 1 - exp(-Σ λ) is the chance it is asked at all. An entry cached until inside the window
   is asked "first" only after it expires: hours before are left out, the hour holding the
   expiry counts by the fraction after it (`after_expiry`);
2. price(h) = idle + (1 - idle) · min(1, load(h) / peak), load the forecast requests of hour h
   over every namespace the plan reads and peak the busiest hour the history holds: a GPU-ms
   at idle costs `idle` of one at peak;
3. value = Σ P_k · (miss_cost · price(k) + latency_weight · miss_latency) - warm_cost ·
   price(send), the send hour being the one before the window (the warm goes out in the 30
   minutes before it).

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
    """Per window hour, the fraction of it after an expiry `expires_h` hours past the window's
    start: 0 before, the remainder of the hour holding it, 1 after."""
    out: np.ndarray = np.clip(np.arange(1, hours + 1, dtype=float) - expires_h, 0.0, 1.0)
    return out


def price_at(load: float, idle: float) -> float:
    """The price of a GPU-ms at `load` (0 idle .. 1 full), 1.0 at full load."""
    return idle + (1.0 - idle) * min(1.0, max(0.0, load))


@dataclass(frozen=True)
class Prices:
    """The price of a GPU-ms in each window hour and in the send hour, 1.0 at peak load."""

    window: tuple[float, ...]
    send: float

    @classmethod
    def from_load(
        cls, load: Sequence[float] | np.ndarray, send_load: float, peak: float, idle: float
    ) -> Prices:
        if not 0.0 <= idle <= 1.0:
            raise ConfigError(f"idle price must lie in [0, 1], got {idle}")
        lam = np.asarray(load, dtype=float)
        util = lam / peak if peak > 0 else np.zeros_like(lam)
        send = send_load / peak if peak > 0 else 0.0
        return cls(tuple(price_at(float(u), idle) for u in util), price_at(send, idle))


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
    """A warm valued by the miss it prevents, in GPU-ms at peak price."""

    p_asked: float  # Σ P_k: the chance the entry is asked in the window (after any expiry)
    price_window: float  # the P-weighted mean price of the hours it is first asked in
    price_send: float
    saved_ms: float  # Σ P_k · (the prevented miss's value at k): the ranking key
    value_ms: float  # saved_ms - warm cost x price_send


def prevented(
    rates: Sequence[float] | np.ndarray,
    miss_cost_ms: float,
    warm_cost_ms: float,
    prices: Prices,
    latency_weight: float = 0.0,
    after: np.ndarray | None = None,
    miss_latency_ms: float | None = None,
) -> Prevented:
    """The value of warming an entry asked at `rates` per window hour (step 3 above); `after`:
    the fraction of each hour that counts (after_expiry), all of it when None; a miss's
    latency None: its GPU ms stand in (module docstring)."""
    lam = np.asarray(rates, dtype=float)
    if after is not None:
        lam = lam * after
    p = first_ask(lam)
    price = np.asarray(prices.window, dtype=float)
    latency = miss_cost_ms if miss_latency_ms is None else miss_latency_ms
    saved = float(p @ (miss_cost_ms * price + latency_weight * latency))
    asked = float(p.sum())
    mean = float(p @ price) / asked if asked > 0 else float(price.mean())
    return Prevented(asked, mean, prices.send, saved, saved - warm_cost_ms * prices.send)
