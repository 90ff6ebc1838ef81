"""The demo's scheduler on the simulated clock: warm ahead of each window of week 2, and the
deploy job's pre-warm, both through the same WarmRunner `stoker warm` and the scheduler use.

Only the clock differs from production: the scheduler's job runs when the demo reaches a
window, not on a wall-clock trigger, so a week fits in minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from demo.client import served_entry
from demo.scenario import Scenario
from invalidators.deployjob import Prewarmer
from schemas.prewarm import PrewarmRequest
from stoker.stack import Stack
from warmers.hotset.plan import Plan
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import HotSetPrewarm, HotSetPrewarmer
from warmers.shadow import WarmConfig


class DemoWarming:
    def __init__(self, sc: Scenario, stack: Stack, backend_url: str) -> None:
        """A warm runner on the pass's Stack (its cache and embedder), to `backend_url`."""
        self.sc = sc
        self.settings = s = stack.settings
        self.runner = stack.runner(progress=False, backend_url=backend_url)
        # The simulated GPU's capacity is ~2,000 QPS (32 slots, ~5 ms an answer plus HTTP):
        # ramp from 5% to 20% of it within half a second, since a window's warm lasts ~1 s.
        # Its engine gauges are not read (metrics_url None): in compressed time they show the
        # warm's own burst, not the simulated hour's load, which the plan prices instead.
        self.runner.warm_config = WarmConfig(
            target_qps=sc.warm_qps, capacity_qps=2_000.0, ramp_s=0.5, concurrency=32,
            min_ttl_left_s=s.warm_min_ttl_left_s, idle_price=s.warm_idle_price,
        )  # fmt: skip
        self.window = Window.next_hour()  # moved to the simulated clock by warm_ahead
        self.prewarms: list[HotSetPrewarm] = []  # what each deploy's pre-warm did

    @classmethod
    def factory(cls, sc: Scenario) -> Callable[[Stack, str], DemoWarming]:
        return lambda stack, url: cls(sc, stack, url)

    def warm_ahead(self, start2: datetime, hour: int) -> dict[str, Any]:
        """What the scheduler does before a window: plan the hot set of the horizon, warm it."""
        begin = start2 + timedelta(hours=hour)
        self.window = Window(begin, begin + timedelta(hours=self.sc.warm_horizon_h))
        plan = self.runner.plan(self.window, Budget(requests=self.sc.warm_budget))
        self.fit(plan, hour)
        s = self.runner.warm(plan)
        # The simulated GPU is time-compressed; what a warm request costs a real GPU is what a
        # miss of that query cost in the log (the profile's learned miss cost).
        # Matched to the plan by key: an item found cached is skipped, so the sends are not
        # the plan's first N.
        keys = [i.item.identity.key() for i in plan.items]
        sent_keys, landed = set(s.sent_keys), set(s.landed_keys)
        sent = [i for i, k in zip(plan.items, keys, strict=True) if k.exact() in sent_keys]
        real_gpu_s = sum(i.miss_cost_ms for i in sent) / 1000.0
        # each landed warm's entry (as the scorer names the entry a hit came from) and its
        # chance of being asked
        warmed = {
            served_entry(i.tenant, i.item.identity.model_version, k.digest): i.p_asked or 0.0
            for i, k in zip(plan.items, keys, strict=True)
            if k.exact() in landed
        }
        return {
            "hour": hour,
            "planned": len(plan.items),
            "sent": s.sent,
            "cached": s.cached,
            "skipped": s.skipped,
            "priced_out": s.skipped_priced,  # worth less than its send at the load then
            "failed": s.failed,
            "refused_stale": s.refused_stale,
            "achieved_qps": round(s.achieved_qps, 1),
            "gpu_seconds": round(real_gpu_s, 2),
            # what the plan expected its sends to save, net of their cost (GPU-s equivalents)
            "expected_gpu_s_saved": round(plan.expected_gpu_s_saved, 2),
            # the misses the sends are expected to prevent (valued by the miss prevented)
            "expected_prevented": round(sum(i.p_asked or 0.0 for i in sent), 2),
            "sim_gpu_seconds": round(s.gpu_seconds, 3),
            "warmed": warmed,
        }

    def fit(self, plan: Plan, hour: int) -> None:
        """Trim a scheduled window's plan before it is sent (demo/headroom.py caps it to the
        send hour's headroom); as planned here."""

    def prewarmer(self) -> Prewarmer:
        """The deploy job's pre-warm for the new version, sized to the settings' hit bar. Its
        window is the scheduler's current one (the horizon, 6 h), not
        STOKER_DEPLOY_PREWARM_HOURS: the demo's figures after the deploy stay comparable with
        the runs before the bar (a 3-hour window plans far fewer items; docs/demo.md, "The
        simulated two weeks", has the run)."""
        s = self.settings
        inner = HotSetPrewarmer(
            self.runner, Budget(requests=3 * self.sc.warm_budget), lambda: self.window,
            hit_bar=s.deploy_prewarm_hit_bar, min_share=s.deploy_prewarm_min_share,
        )  # fmt: skip
        return _Recorded(inner, self.prewarms)


class _Recorded:
    """A pre-warmer that keeps what each run did, for the report's GPU accounting."""

    def __init__(self, inner: HotSetPrewarmer, into: list[HotSetPrewarm]) -> None:
        self.inner, self.into = inner, into

    def prewarm(self, req: PrewarmRequest) -> HotSetPrewarm:
        got = self.inner.prewarm(req)
        self.into.append(got)
        return got
