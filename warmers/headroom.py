"""The headroom a warm may spend: the capacity under the busiest hour, less the hour's own load.

A warm moves GPU work out of the hours it prepares into the hour it is sent in. Sent in an hour
that is itself busy, it makes the peak it exists to flatten: a deploy's pre-warm, sized to a
hit bar and sent in the hour before the cutover, did exactly that. So every hour a warm runs in
has a cap, in GPU-seconds: the ceiling (the busiest hour the traffic is forecast to bring
without warming) minus the live GPU forecast for that hour, never below zero.

What does not fit under one hour's cap waits for the next send hour, or is left out:
- a deploy announced with a lead spreads its pre-warm over the lead hours (`lead_prewarm`),
  each sending what fits under its own hour's cap; the cutover's own pre-warm then finds those
  entries fresh and sends only what is still missing for its bar;
- a scheduled warm keeps, in rank order, the items that fit (`cap_plan`).

The forecast is the caller's: GPU-seconds per hour from the traffic profile (requests per hour
of week times their cost per miss) or, in the demo, from the week the profile was learned from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schemas.errors import ConfigError
from warmers.hotset.plan import Plan, Skipped
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import size_to_bar
from warmers.runner import WarmRunner

_EPS = 1e-9


@dataclass(frozen=True)
class Headroom:
    """GPU-seconds a warm may spend per hour: `ceiling_gpu_s` minus `live_gpu_s(hour)`, the
    live GPU forecast for the hour (hours numbered as the caller numbers them)."""

    ceiling_gpu_s: float
    live_gpu_s: Callable[[int], float]

    def __post_init__(self) -> None:
        if self.ceiling_gpu_s < 0:
            raise ConfigError(f"headroom ceiling must be >= 0 GPU-s, got {self.ceiling_gpu_s}")

    @classmethod
    def under_peak(
        cls, live_gpu_s: Sequence[float], first_hour: int = 0, share: float = 1.0
    ) -> Headroom:
        """From a forecast of live GPU-s per hour (`first_hour` onwards): the ceiling is
        `share` of the busiest of those hours. A share under 1 aims below the peak: what a
        warm takes out of the peak hour only lowers it if no send hour fills the room again."""
        if not 0.0 < share <= 1.0:
            raise ConfigError(f"headroom share must lie in (0, 1], got {share}")
        hours = list(live_gpu_s)

        def live(hour: int) -> float:
            i = hour - first_hour
            return hours[i] if 0 <= i < len(hours) else 0.0

        return cls(share * max(hours, default=0.0), live)

    def cap(self, hour: int) -> float:
        """What warms sent in `hour` may spend, in GPU-seconds (0 in an hour at the ceiling)."""
        return max(0.0, self.ceiling_gpu_s - self.live_gpu_s(hour))


def cap_plan(plan: Plan, gpu_s: float) -> float:
    """Keep plan.items, in rank order, while their sends' expected GPU (warm_cost_ms) fits in
    `gpu_s`; an item too big for what is left is passed over for the smaller ones after it.
    What is left out is noted in plan.skipped. Returns the GPU-seconds kept."""
    kept, spent = [], 0.0
    for i in plan.items:
        c = i.warm_cost_ms / 1000.0
        if spent + c <= gpu_s + _EPS:
            kept.append(i)
            spent += c
        else:
            why = f"left out: over the send hour's headroom ({gpu_s:.1f} GPU-s)"
            plan.skipped.append(Skipped(i.tenant, i.query, why, i.expected_hits, i.value_ms))
    plan.items = kept
    return spent


@dataclass
class LeadStep:
    """What one lead hour of a deploy's pre-warm did."""

    hour: int
    cap_gpu_s: float
    planned: int = 0  # items the bar still needs (before the cap)
    kept: int = 0  # of them, what fitted under the cap
    sent: int = 0
    landed: int = 0
    gpu_s: float = 0.0  # the sent items' cost per miss, from the profile
    fresh: int = 0  # items in the new namespace already (earlier lead hours')
    # the share of the window's expected warmable requests the fresh and landed items serve
    in_place: float = 0.0
    sent_keys: list[str] = field(default_factory=list, repr=False)


def lead_prewarm(
    runner: WarmRunner,
    budget: Budget,
    window: Window,
    model_id: str,
    version: str,
    *,
    hit_bar: float,
    cap_gpu_s: float,
    hour: int,
) -> LeadStep:
    """One lead hour of a deploy announced ahead: plan the deploy's `window` for `version` as
    the cutover's pre-warm does (valued by hits, sized to `hit_bar`), and send only what fits
    under this hour's `cap_gpu_s`. What earlier lead hours landed is fresh in the plan, so each
    hour sends the next best items the bar still needs."""
    step = LeadStep(hour, cap_gpu_s)
    plan = runner.plan(window, budget, model_id=model_id, model_version=version, value_model="hits")
    step.fresh = len(plan.fresh)
    if plan.hit_share([*plan.fresh, *plan.items]) >= hit_bar - _EPS:
        size_to_bar(plan, hit_bar)
    step.planned = len(plan.items)
    cap_plan(plan, cap_gpu_s)
    step.kept = len(plan.items)
    step.in_place = plan.hit_share(plan.fresh)
    if not plan.items:
        return step
    s = runner.warm(plan, labels={"model_id": model_id, "version": version, "lead": str(hour)})
    sent, landed = set(s.sent_keys), set(s.landed_keys)
    key = {id(i): i.item.identity.key().exact() for i in plan.items}
    step.sent, step.landed = s.sent, s.cached
    step.gpu_s = sum(i.miss_cost_ms for i in plan.items if key[id(i)] in sent) / 1000.0
    step.in_place = plan.hit_share([*plan.fresh, *(i for i in plan.items if key[id(i)] in landed)])
    step.sent_keys = list(s.sent_keys)
    return step
