"""When a warm is sent, and whether it is worth sending (step 4 of warmers/hotset/select.py).

Each plan item is valued by the miss it prevents (value.py) at the send hour that pays most;
the items' send hours are chosen together, each send planned in an hour raising its price for
the next (`spread`); then the scheduler's rule (`pays`: the break-even and min_p_send) or a
named budget's floor (min_p_asked) says which go now, which wait for their hour (deferred),
and which are left out, each with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np

from warmers.hotset.forecast import NamespaceForecast
from warmers.hotset.options import HotSetConfig
from warmers.hotset.plan import Plan, PlanItem, Skipped
from warmers.hotset.value import Prevented, Prices, after_expiry, prevented


def floor_hour(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


def span_start(plan: Plan) -> datetime:
    """The first hour of the plan's span (its window's start, without send hours before)."""
    return plan.span_start or plan.window.start


class SendTimes:
    """Step 4's choices for the items of a plan, on the planner's options."""

    def __init__(self, cfg: HotSetConfig) -> None:
        self.cfg = cfg

    def could_pay(
        self,
        ns: NamespaceForecast,
        top: list[str],
        costs: dict[str, float],
        latencies: dict[str, float],
        prices: Prices,
        scale: float,
        plan: Plan,
    ) -> list[str]:
        """The queries whose warm could beat the break-even bar in its best case: asked with
        the chance of its whole span, each miss at the dearest hour's price, sent at the
        cheapest. The rest cannot pay whenever they are sent: left out before their
        representatives are read (most of a long tail, on a scheduler's every run)."""
        ahead = np.ones(len(ns.load)) if prices.ahead is None else np.asarray(prices.ahead)
        dear, cheap = max(prices.hours), min(prices.hours[s] for s in prices.sends)
        bar = self.cfg.min_value_ms or 0.0
        keep = []
        for q in top:
            if q not in costs:
                keep.append(q)  # _row says why it has no representative
                continue
            lam = scale * float(ns.hourly(q) @ ahead)
            best = -math.expm1(-lam) * (costs[q] * dear + self.cfg.latency_weight * latencies[q])
            if best - costs[q] * cheap > bar:
                keep.append(q)
            else:
                why = (
                    f"below break-even (asked with p {-math.expm1(-lam):.2f} at most: its first "
                    f"miss saved can never beat its send, {costs[q]:.0f} GPU ms at price "
                    f"{cheap:.2f})"
                )
                plan.skipped.append(Skipped(ns.tenant, q, why, ns.hits.get(q), None))
        return keep

    def valued_after(
        self, i: PlanItem, expires: datetime, plan: Plan, prices: Prices, what: str
    ) -> PlanItem:
        """The item valued for the span's hours after `expires` only (value.after_expiry)."""
        h = max(0.0, (expires - span_start(plan)).total_seconds() / 3600)
        item = replace(i, valued_from=h)
        why = f"; {what} until {expires + timedelta(seconds=30):%H:%M} UTC, valued after"
        return priced(with_reason(item, why), self.value(item, prices))

    def value(self, i: PlanItem, prices: Prices) -> Prevented:
        """The item's worth at `prices` (value.prevented), after its expiry if it has one."""
        after = None if i.valued_from is None else after_expiry(len(prices.hours), i.valued_from)
        return prevented(
            i.rates, i.miss_cost_ms, i.warm_cost_ms, prices, self.cfg.latency_weight, after,
            i.miss_latency_ms,
        )  # fmt: skip

    def pays(self, value_ms: float, p_asked: float) -> bool:
        """The scheduler's own rule: worth more than min_value_ms, asked with min_p_send."""
        bar = self.cfg.min_value_ms
        return (bar is None or value_ms > bar) and p_asked >= self.cfg.min_p_send

    def spread(
        self, ranked: dict[str, list[PlanItem]], plan: Plan, prices: Prices
    ) -> dict[str, list[PlanItem]]:
        """Step 4's send hours, chosen together: in rank order over every tenant, each item
        takes its cheapest hour at the prices of the load forecast plus one request for each
        send planned there before it. Chosen alone, every hot entry of a day took the same
        last cheap hour before the ramp, and that hour became the day's peak; chosen together,
        they fill the trough's hours, and the marginal ones no longer pay."""
        if plan.named or len(prices.sends) < 2:
            return ranked
        extra = np.zeros(len(prices.hours))
        done: dict[int, PlanItem] = {}
        for i in sorted((i for items in ranked.values() for i in items), key=PlanItem.rank):
            v = self.value(i, prices.with_extra(extra))
            if self.pays(v.value_ms, v.p_asked):
                extra[v.send] += 1.0
            done[id(i)] = priced(i, v)
        return {t: sorted((done[id(i)] for i in items), key=PlanItem.rank)
                for t, items in ranked.items()}  # fmt: skip

    def worth_warming(self, items: list[PlanItem], plan: Plan, now: datetime) -> list[PlanItem]:
        """Valued by the miss it prevents. Under the planner's own rule, what is worth more
        than min_value_ms in its cheapest send hour: due now, kept with the figures; due later,
        deferred to that hour (plan.deferred); the rest is left out below break-even, with its
        value. Under a named budget (sent now), what is asked with p >= min_p_asked."""
        out = []
        now = floor_hour(now)
        for i in items:
            p, pw, ps = i.p_asked or 0.0, i.price_window or 0.0, i.price_send or 0.0
            send = plan.send_at(i) or now
            if plan.named:
                if p >= self.cfg.min_p_asked:
                    out.append(with_reason(i, f"; asked with p {p:.2f} at price {pw:.2f}"))
                else:
                    why = f"below the floor (asked with p {p:.2f}, under {self.cfg.min_p_asked:g})"
                    plan.skipped.append(
                        Skipped(i.tenant, i.query, why, i.expected_hits, i.value_ms)
                    )
            elif self.pays(i.value_ms, p):
                why = (
                    f"; first asked with p {p:.2f} at price {pw:.2f}, sent {send:%H:%M} at {ps:.2f}"
                )
                if send <= now:
                    out.append(with_reason(i, why))
                else:
                    plan.deferred.append(with_reason(i, f"{why} (now it would pay less)"))
            elif self.cfg.min_value_ms is None or i.value_ms > self.cfg.min_value_ms:
                why = (
                    f"below the send bar (asked before it expires with p {p:.2f}, under "
                    f"{self.cfg.min_p_send:g}: a send no one asks burns GPU)"
                )
                plan.skipped.append(Skipped(i.tenant, i.query, why, i.expected_hits, i.value_ms))
            else:
                why = (
                    f"below break-even (prevents a miss with p {p:.2f}, worth "
                    f"{i.prevented_ms or 0.0:.0f} GPU ms at price {pw:.2f}; its warm send costs "
                    f"{i.warm_cost_ms * ps:.0f} at price {ps:.2f})"
                )
                plan.skipped.append(Skipped(i.tenant, i.query, why, i.expected_hits, i.value_ms))
        return out


def with_reason(i: PlanItem, more: str) -> PlanItem:
    return replace(i, reason=i.reason + more)


def priced(i: PlanItem, v: Prevented, rates: tuple[float, ...] | None = None) -> PlanItem:
    return replace(
        i, p_asked=v.p_asked, price_send=v.price_send, price_window=v.price_window,
        prevented_ms=v.saved_ms, rates=i.rates if rates is None else rates, send_hour=v.send,
    )  # fmt: skip


def ahead(span_start: datetime, now: datetime, end: datetime) -> tuple[float, ...]:
    """Per span hour, the share of it still to come at `now`: the hour under way is partly
    gone, and its asks so far can no longer be prevented."""
    n = int((end - span_start).total_seconds() // 3600)
    gone = (now - span_start).total_seconds() / 3600
    return tuple(min(1.0, max(0.0, k + 1 - gone)) for k in range(n))


def prices_for(
    spaces: Sequence[NamespaceForecast],
    cfg: HotSetConfig,
    sends: tuple[int, ...],
    start: int,
    ahead: tuple[float, ...] | None = None,
) -> Prices:
    """Step 4's prices, from the load of every namespace the plan reads: each span hour's
    forecast, over the busiest hour the retained weeks hold, all of those namespaces summed
    (their hourly totals, read once with the forecast)."""
    # nothing learned yet: an empty load over the span the sends and the start lie in
    span = len(ahead) if ahead is not None else max(start, *sends) + 1
    hours = len(spaces[0].load) if spaces else span
    load = np.zeros(hours)
    by_week: dict[int, np.ndarray] = {}
    for ns in spaces:
        load += ns.load
        for week, hc in ns.history.items():
            by_week[week] = by_week.get(week, 0.0) + np.asarray(hc.warmable, dtype=float)
    peak = max((float(v.max()) for v in by_week.values()), default=0.0)
    return Prices.from_load(load, peak, cfg.idle_price, sends, start, ahead)
