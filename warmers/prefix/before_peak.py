"""The prefix warm before each day's peak: the scheduler re-sends the hot prompt prefixes in the
`lead_s` before the busiest hour, so the backend's prefix cache holds them when the traffic
arrives.

A prefix cache fills itself on first use, and the quiet hours before a peak evict what the day
did not ask (vLLM's blocks go least recently used first). The traffic profile knows, per model,
how many requests each hour of the week held over the retained weeks (warmers/traffic/profile.py); the
busiest hour of each weekday is that day's peak. In the `lead_s` before it, once per model and
day, the scheduler's leader sends the model's hot prefixes (warmers/prefix/warm.py). A prefix
still held costs a token or two of prefill and one decoded token; one evicted costs its
prefill now, at the quiet hour's price, instead of during the peak.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import numpy as np

from schemas.common import utcnow
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile

log = logging.getLogger(__name__)

HOURS_PER_DAY = 24
# Half an hour before the peak: long enough to send a few hundred prefixes at the warm's pace,
# short enough that the quiet hours before it cannot evict them again.
DEFAULT_LEAD_S = 1800.0


def busiest_hours(profile: TrafficProfile) -> dict[str, list[int]]:
    """Per model, the busiest UTC hour of each weekday (Monday first) over the retained weeks,
    every tenant and template summed (warmable requests and the rest: all of them prefill)."""
    totals: dict[str, np.ndarray] = {}
    for tenant in profile.tenants():
        for model, template in profile.namespaces(tenant):
            acc = totals.setdefault(model, np.zeros(HOURS_PER_WEEK))
            for hc in profile.hourly_counts(tenant, model, template).values():
                acc += np.asarray(hc.warmable, dtype=float) + np.asarray(hc.uncacheable, float)
    return {
        m: [int(np.argmax(v[d * HOURS_PER_DAY : (d + 1) * HOURS_PER_DAY])) for d in range(7)]
        for m, v in sorted(totals.items())
        if v.sum() > 0
    }


@dataclass
class PeakPrefixWarm:
    """The scheduler's job: call it every few minutes (more often than `lead_s`)."""

    profile: TrafficProfile
    warm: Callable[[str], object]  # model id -> the prefix warm's report
    lead_s: float = DEFAULT_LEAD_S
    clock: Callable[[], datetime] = utcnow
    done: dict[str, date] = field(default_factory=dict)  # model -> the peak's day warmed for

    def __call__(self) -> list[str]:
        """Warm the models whose peak starts within `lead_s`; the models warmed."""
        now = self.clock()
        warmed = []
        for model, hours in busiest_hours(self.profile).items():
            peak = _next_peak(now, hours)
            if peak - now > timedelta(seconds=self.lead_s) or self.done.get(model) == peak.date():
                continue
            self.done[model] = peak.date()  # once, even if the warm fails: the next day retries
            report = self.warm(model)
            log.info("prefix warm before the %s peak of %s: %s", f"{peak:%a %H:00}", model, report)
            warmed.append(model)
        return warmed


def _next_peak(now: datetime, hours: list[int]) -> datetime:
    """The start of the next peak hour after `now` (today's, or tomorrow's once it began)."""
    today = now.replace(minute=0, second=0, microsecond=0)
    start = today.replace(hour=hours[now.weekday()])
    if start <= now:
        tomorrow = today + timedelta(days=1)
        start = tomorrow.replace(hour=hours[tomorrow.weekday()])
    return start
