"""The warm budget (requests or GPU-seconds) and its fair split across tenants.

Fairness is weighted max-min (water-filling): each tenant's weight is its expected warmable
traffic in the window, capped at `cap` x the median tenant's (so a flood cannot buy the budget)
and floored at `floor` x the mean weight (so a small tenant is never starved by a big one); a
tenant that needs less than its share keeps only what it needs and the rest is split again
among the others, by weight, until the budget or every demand is used up.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import ConfigError

# A quarter of the mean weight: a tenant with 1% of the traffic still gets a quarter of an
# equal share when it has hot queries, enough for its top few without taxing the big ones much.
DEFAULT_FLOOR = 0.25
# A tenant weighs at most 4x the median tenant. Uncapped, traffic bought budget without limit:
# one tenant flooding 30 hot prompts at 11x the others' volume took 50 of 60 warm requests and
# left two real tenants 5 each of the 30 they needed (tests/faults/test_tenant_flood.py). Capped,
# a flood takes at most 4/(n+3) of the budget among n tenants (2/3 of it with three), however
# big it grows, and a genuinely big tenant still gets up to 4x a typical one's share.
DEFAULT_CAP = 4.0
_EPS = 1e-9


@dataclass(frozen=True)
class Budget:
    """Exactly one of requests (warm sends) or gpu_seconds (their expected GPU time)."""

    requests: int | None = None
    gpu_seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.gpu_seconds is None):
            raise ConfigError("a budget is either requests or GPU-seconds, exactly one")
        if (self.requests is not None and self.requests < 0) or (
            self.gpu_seconds is not None and self.gpu_seconds < 0
        ):
            raise ConfigError("a budget cannot be negative")

    @property
    def total(self) -> float:
        return float(self.requests if self.requests is not None else self.gpu_seconds or 0.0)

    def cost(self, warm_cost_ms: float) -> float:
        """What one warm send spends: 1 request, or its expected GPU-seconds."""
        return 1.0 if self.requests is not None else warm_cost_ms / 1000.0

    def __str__(self) -> str:
        if self.requests is not None:
            return f"{self.requests} requests"
        return f"{self.gpu_seconds:g} GPU-seconds"


class BudgetOptions(BaseModel):
    """The owner of the warm_budget_* settings' defaults and bounds (stoker/options.py): one
    warm run's budget, in warm sends, or in their expected GPU-seconds when that is set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int = Field(default=500, ge=0)
    gpu_seconds: float | None = Field(default=None, ge=0)

    def budget(self) -> Budget:
        if self.gpu_seconds is not None:
            return Budget(gpu_seconds=self.gpu_seconds)
        return Budget(requests=self.requests)


def fair_shares(
    total: float,
    demands: Mapping[str, float],
    weights: Mapping[str, float],
    floor: float = DEFAULT_FLOOR,
    cap: float = DEFAULT_CAP,
) -> dict[str, float]:
    """Weighted max-min fair split of `total`; no tenant gets more than its demand."""
    shares = dict.fromkeys(demands, 0.0)
    active = {t for t, d in demands.items() if d > _EPS}
    if not active:
        return shares
    raw = {t: max(weights.get(t, 0.0), 0.0) for t in active}
    # median_low: with two tenants, the smaller one's weight (a plain median would average in
    # the flood it is meant to bound)
    ceiling = cap * statistics.median_low(raw.values())
    if ceiling > 0:
        raw = {t: min(x, ceiling) for t, x in raw.items()}
    mean_w = sum(raw.values()) / len(active)
    w = {t: max(raw[t], floor * mean_w, _EPS) for t in active}
    remaining = total
    while active and remaining > _EPS:
        wsum = sum(w[t] for t in active)
        offer = {t: remaining * w[t] / wsum for t in active}
        sated = {t for t in active if shares[t] + offer[t] >= demands[t] - _EPS}
        if not sated:
            for t in active:
                shares[t] += offer[t]
            break
        for t in sated:
            remaining -= demands[t] - shares[t]
            shares[t] = demands[t]
        active -= sated
    return shares
