"""The demo's headroom (warmers/headroom.py): what warms may spend in each hour of week 2.

The forecast is last week's: week 1's requests replayed, hour for hour of the week, through a
cache that keeps each answer for the regime's TTL (a miss stores it, the first request after it
expires misses again), empty at the regime's first hour (each pass starts on a fresh stack) and
emptied again at the announced deploy (the new version starts cold). That is the live GPU the
baseline is forecast to spend per hour, and its busiest hour is the ceiling; nothing of week 2
is read ahead (HourCaps reads each hour's forecast against the hours already served). Uncacheable
requests (sampling, no-cache) miss every time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import orjson

from caches.policy import request_bypass_reason
from demo.client import replay_identity
from demo.scenario import NEW_VERSION, Scenario, Traffic
from demo.warming import DemoWarming, _Recorded
from invalidators.deployjob import Prewarmer
from schemas.common import RequestParams
from schemas.prewarm import PrewarmRequest
from stoker.stack import Stack
from warmers.headroom import TREND_HOURS, Headroom, lead_prewarm, load_ratio
from warmers.hotset.plan import Plan, cap_plan
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.prewarm import MAX_HOURS, HotSetPrewarm, HotSetPrewarmer

WEEK_H = 7 * 24


def forecast_live_gpu(traffic: Traffic, sc: Scenario) -> list[float]:
    """Live GPU-seconds per served hour of week 2 (index 0 = sc.first_h), forecast from week 1
    (module docstring)."""
    hours = sc.served_hours
    out = [0.0] * len(hours)
    ttl_s = sc.ttl_h * 3600.0
    expires: dict[tuple[str, ...], float] = {}
    flushed = False
    bypass: dict[str, bool] = {}
    for row in sorted(traffic.week1, key=lambda r: r["ts"]):
        h = traffic.hour_of(row) + WEEK_H  # week 1's hour of week, as the same hour of week 2
        if h not in hours:
            continue
        if not flushed and sc.deploy_at_h in hours and h >= sc.deploy_at_h:
            expires.clear()
            flushed = True
        t = (row["ts"] - traffic.start2).total_seconds() + WEEK_H * 3600.0
        key = replay_identity(row)
        if row["params"] not in bypass:
            bypass[row["params"]] = _uncacheable(row["params"])
        if not bypass[row["params"]] and expires.get(key, -1.0) > t:
            continue
        out[h - hours.start] += row["gpu_ms"] / 1000.0
        if not bypass[row["params"]]:
            expires[key] = t + ttl_s
    return out


def _uncacheable(params: str) -> bool:
    try:
        return (
            request_bypass_reason(RequestParams(**(orjson.loads(params or "{}") or {}))) is not None
        )
    except (ValueError, TypeError):
        return True


class HourCaps:
    """Each send hour's cap (Headroom.cap), less what warms already spent in it: the
    scheduler's windows and the deploy's lead share an hour's room.

    The hour's forecast is read against the load served in the TREND_HOURS before it
    (warmers/headroom.py, load_ratio), as the scheduler reads it against the busy seconds the
    model server reports. The simulated GPU is time-compressed, so its own busy seconds are
    not what a real one would report; what the demo's run loop hands `observe` is the log's
    GPU cost of the hour's live misses, the busy seconds a real server would have said. Only
    hours already served are read."""

    def __init__(self, headroom: Headroom) -> None:
        self.headroom = headroom
        self.spent: dict[int, float] = defaultdict(float)
        self.served: dict[int, float] = {}  # live GPU-s of each hour served

    def observe(self, hour: int, live_gpu_s: float) -> None:
        self.served[hour] = live_gpu_s

    def ratio(self, hour: int) -> float:
        """How the served hours of the TREND_HOURS before `hour` ran against their forecast
        (1.0 before any is served)."""
        hours = [h for h in range(hour - TREND_HOURS, hour) if h in self.served]
        forecast = sum(self.headroom.live_gpu_s(h) for h in hours)
        r = load_ratio(sum(self.served[h] for h in hours), forecast)
        return 1.0 if r is None else r

    def left(self, hour: int) -> float:
        return max(0.0, self.headroom.cap(hour, self.ratio(hour)) - self.spent[hour])

    def spend(self, hour: int, gpu_s: float) -> None:
        self.spent[hour] += gpu_s


def hour_caps(traffic: Traffic, sc: Scenario) -> HourCaps:
    """The regime's caps: the ceiling is `sc.headroom_share` of the forecast's busiest hour."""
    live = forecast_live_gpu(traffic, sc)
    share = 1.0 if sc.headroom_share is None else sc.headroom_share
    return HourCaps(Headroom.under_peak(live, sc.first_h, share))


class HeadroomWarming(DemoWarming):
    """The demo's warming with every warm held to its send hour's headroom (HourCaps): the
    scheduler's windows keep the items that fit; a deploy announced `sc.deploy_lead_h` hours
    ahead pre-warms the new version over those hours (lead_ahead); the cutover's own pre-warm
    sends what fits in the hour before it and cuts over at the hit rate then in place, the
    scheduler's next windows warming the rest behind READY. A window that starts at the
    deploy is left to the pre-warm: warmed for the old version, it would serve for seconds."""

    def __init__(
        self,
        sc: Scenario,
        stack: Stack,
        backend_url: str,
        caps: HourCaps,
        model_id: str,
    ) -> None:
        super().__init__(sc, stack, backend_url)
        self.caps, self.model_id = caps, model_id
        self.leads: list[dict[str, Any]] = []  # each lead hour's pre-warm, the cutover's too

    @classmethod
    def capped(cls, sc: Scenario, traffic: Traffic) -> Callable[[Stack, str], DemoWarming]:
        model_id = str(traffic.week1[0]["model_id"])
        return lambda stack, url: cls(sc, stack, url, hour_caps(traffic, sc), model_id)

    def observe(self, hour: int, live_gpu_s: float) -> None:
        """What the GPU carried for the live traffic of `hour`, once it is served (HourCaps)."""
        self.caps.observe(hour, live_gpu_s)

    def send_hour(self, hour: int) -> int:
        """The hour a warm made before serving `hour` is counted in (demo.report.hourly_gpu):
        the one before it, the regime's first hour for a warm made before it starts."""
        return max(hour - 1, self.sc.first_h)

    def fit(self, plan: Plan, hour: int) -> None:
        cap_plan(plan, self.caps.left(self.send_hour(hour)))

    def warm_ahead(self, start2: datetime, hour: int) -> dict[str, Any]:
        if hour == self.sc.deploy_at_h:
            self.window = self.deploy_window(start2)  # the cutover's pre-warm plans it
            return {"hour": hour, "planned": 0, "sent": 0, "gpu_seconds": 0.0, "warmed": {},
                    "left_to_prewarm": True}  # fmt: skip
        out = super().warm_ahead(start2, hour)
        self.caps.spend(self.send_hour(hour), out["gpu_seconds"])
        return out

    def deploy_window(self, start2: datetime) -> Window:
        """The hours the deploy's pre-warm plans: from the cutover, the regime's TTL (at most
        MAX_HOURS, as STOKER_DEPLOY_PREWARM_HOURS), or the scheduler's horizon if longer. An
        entry warmed for the deploy serves for its TTL: valued over the horizon alone, a query
        asked four times a day but less than once in six hours fell below break-even."""
        begin = start2 + timedelta(hours=self.sc.deploy_at_h)
        hours = max(self.sc.warm_horizon_h, min(self.sc.ttl_h, MAX_HOURS))
        return Window(begin, begin + timedelta(hours=hours))

    def lead_ahead(self, start2: datetime, hour: int) -> dict[str, Any]:
        """One lead hour of the announced deploy: the new version's pre-warm, as much of it
        as this hour's headroom holds (warmers.headroom.lead_prewarm)."""
        self.window = self.deploy_window(start2)
        step = self._lead(hour, NEW_VERSION)
        self.leads.append(step)
        return step

    def _lead(self, hour: int, version: str) -> dict[str, Any]:
        send = self.send_hour(hour)
        step = lead_prewarm(
            self.runner, self.prewarm_budget(), self.window, self.model_id, version,
            hit_bar=self.settings.deploy_prewarm_hit_bar, cap_gpu_s=self.caps.left(send),
            hour=hour,
        )  # fmt: skip
        self.caps.spend(send, step.gpu_s)
        return {
            "hour": hour, "cap_gpu_s": round(step.cap_gpu_s, 1), "planned": step.planned,
            "kept": step.kept, "sent": step.sent, "landed": step.landed,
            "gpu_seconds": round(step.gpu_s, 2), "in_place": round(step.in_place, 4),
        }  # fmt: skip

    def prewarm_budget(self) -> Budget:
        return Budget(requests=3 * self.sc.warm_budget)

    def prewarmer(self) -> Prewarmer:
        return _Recorded(_CappedPrewarm(self), self.prewarms)  # type: ignore[arg-type]


class _CappedPrewarm:
    """The cutover's pre-warm under the headroom: what fits in the hour before the deploy is
    sent (a lead step), then the bar is what is in place (the settings' bar, or less), so
    READY is not held for sends the hour has no room for. The report's lead_warms count the
    step's sends; the HotSetPrewarm returned counts only the top-up it made, if any."""

    def __init__(self, warming: HeadroomWarming) -> None:
        self.w = warming

    def prewarm(self, req: PrewarmRequest) -> HotSetPrewarm:
        w = self.w
        step = w._lead(w.sc.deploy_at_h, req.version)
        w.leads.append(step)
        bar = min(w.settings.deploy_prewarm_hit_bar, max(step["in_place"], MIN_BAR))
        inner = HotSetPrewarmer(
            w.runner, w.prewarm_budget(), lambda: w.window,
            hit_bar=bar, min_share=w.settings.deploy_prewarm_min_share,
        )  # fmt: skip
        return inner.prewarm(req)


# The bar when nothing is in place: a bar must be above 0 (HotSetPrewarmer), and this one
# keeps the top-up to the first item or two of each tenant.
MIN_BAR = 0.001
