"""Steps 1-2 of the hot set (warmers/hotset/select.py): each query's expected requests in a window.

Per (tenant, model, template): the past days of each window day's regime, the live log's
surges, the retained weeks' tail; per window hour as well as summed, with the namespace's
forecast load per hour and in the hour before the window (what a warm is priced by).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np

from warmers.hotset.regimes import DayRegimes, cluster_days
from warmers.hotset.window import Window
from warmers.traffic.profile import HourlyCounts, TrafficProfile, daily_from, week_and_hour

if TYPE_CHECKING:
    from warmers.hotset.options import HotSetConfig

# A query the matching days did not ask (or barely): its floor, as a share of its share of every
# retained week. With the value bar, a token share (it is ranked, not expected); ranked past
# break-even, all of it (PAST_BREAK_EVEN).
FALLBACK = 1e-3
PAST_BREAK_EVEN = 1.0
_ALL = 10**9  # "every query": top_queries sums whole hourly hashes, so the limit only trims


@dataclass
class NamespaceForecast:
    """One (tenant, model, template)'s expected hits for the window, and their hours."""

    tenant: str
    model_id: str
    template_version: str
    history: dict[int, HourlyCounts]  # the weeks' hourly totals (profile.hourly_counts)
    load: np.ndarray  # expected warmable requests per window hour, in window order
    hits: dict[str, float] = field(default_factory=dict)  # summed over the window
    # the hits of the queries the regimes forecast, per window hour (the rest: `hourly`)
    per_hour: dict[str, np.ndarray] = field(default_factory=dict)
    volume: float = 0.0  # expected warmable requests in the window
    load_send: float | None = None  # ... in the hour before it, where the regimes forecast it
    note: str = ""

    def hourly(self, qkey: str) -> np.ndarray:
        """The query's expected requests per window hour: the regimes' own split, else (a
        surge, the fallback) its hits spread in proportion to the window's hourly volume."""
        got = self.per_hour.get(qkey)
        if got is not None:
            return got
        total = float(self.load.sum())
        shape = self.load / total if total > 0 else np.full(len(self.load), 1 / len(self.load))
        out: np.ndarray = self.hits.get(qkey, 0.0) * shape
        return out


class Forecaster:
    """Reads the profile; memoises what depends only on the past days."""

    def __init__(self, profile: TrafficProfile, config: HotSetConfig) -> None:
        self.profile = profile
        self.cfg = config
        # Day clustering (KMeans + silhouette, ~0.5 s) depends only on the past days' counts:
        # memoised on them, so a scheduler planning every window re-clusters once a day.
        self._regimes: dict[tuple[object, ...], DayRegimes] = {}
        self._memo: dict[tuple[object, ...], float] = {}

    def expected_hits(
        self, tenant: str, model_id: str, template: str, window: Window
    ) -> NamespaceForecast:
        # one read of the weeks' hourly totals serves every step of this plan
        hourly = self.profile.hourly_counts(tenant, model_id, template)
        today = window.start.date()
        regimes = self._day_regimes(tenant, model_id, template, hourly, today)
        ns = NamespaceForecast(tenant, model_id, template, hourly, np.zeros(window.hours()))
        at = {slot: k for k, slot in enumerate(window.slots())}
        by_day: dict[date, list[int]] = {}
        for d, h in window.slots():
            by_day.setdefault(d, []).append(h)
        notes = set()
        for d, hours in by_day.items():
            days = regimes.matching_days(d)
            if not days:
                continue
            counts, qkeys, totals, weight = self._hourly(ns, days, today)
            bg = self._background(ns, days)
            share = self._share(counts, totals, hours, bg)  # (queries, len(hours))
            per_hour_volume = totals[hours] / weight
            expected = share @ per_hour_volume
            ns.volume += float(per_hour_volume.sum())
            cols = [at[(d, h)] for h in hours]
            ns.load[cols] += per_hour_volume
            for q, e, split in zip(qkeys, expected.tolist(), share * per_hour_volume, strict=True):
                ns.hits[q] = ns.hits.get(q, 0.0) + e
                row = ns.per_hour.get(q)
                if row is None:
                    row = ns.per_hour[q] = np.zeros(window.hours())
                row[cols] += split
            notes.add(f"{_regime_name(regimes, d)} ({len(days)} days)")
        ns.note = ", ".join(sorted(notes)) or "no history"
        self._fallback(ns)
        ns.note += self._surges(ns, window)
        # the send hour: the one before the window, from the past days of its own day's regime
        send = window.start - timedelta(hours=1)
        days = regimes.matching_days(send.date())
        if days:
            totals, weight = self._totals(hourly, days, today)
            ns.load_send = float(totals[send.hour] / weight)
        return ns

    def _day_regimes(
        self,
        tenant: str,
        model_id: str,
        template: str,
        hourly: dict[int, HourlyCounts],
        today: date,
    ) -> DayRegimes:
        past = {d: v for d, v in daily_from(hourly).items() if d < today}
        memo = (tenant, model_id, template, *((d, tuple(v)) for d, v in sorted(past.items())))
        regimes = self._regimes.get(memo)
        if regimes is None:
            if len(self._regimes) > 256:
                self._regimes.clear()
            regimes = self._regimes[memo] = cluster_days(past)
        return regimes

    def _surges(self, ns: NamespaceForecast, window: Window) -> str:
        """Step 2's live hours: a query surging there is expected at its recent share of the
        window's volume, spread over the hours as the volume is. Returns the note's tail."""
        recent, seen = self._recent(ns, window)
        if not seen:
            return ""
        if not ns.volume:  # no regime forecast: the load is the recent rate, hour after hour
            ns.load[:] = seen / self.cfg.recent_hours
        # the window's volume as the regimes forecast it, or the recent rate if none
        ahead = ns.volume or seen / self.cfg.recent_hours * window.hours()
        surging = 0
        for q, c in recent.items():
            now = c / seen * ahead  # at its share of the last hours
            usual = ns.hits.get(q, 0.0)
            if c >= self.cfg.recent_min_count and now > self.cfg.recent_surge * usual:
                ns.hits[q] = now
                ns.per_hour.pop(q, None)
                surging += 1
        return f" + the last {self.cfg.recent_hours} h ({seen} requests, {surging} surging)"

    def _fallback(self, ns: NamespaceForecast) -> None:
        """Whatever the retained weeks asked, at any hour of any day, by how much: a floor of
        its share of those weeks x the window's volume, times FALLBACK (under every query the
        forecast really expects: a query the matching days never asked is ranked, by how much
        it was asked at all, not expected), or, ranked past break-even (a budget of K buys K
        items), times PAST_BREAK_EVEN: the budget's tail goes to the most asked, as a naive
        top-K's would, not to the one-offs of the matching days. (bench hot_set_shapes, K=1000,
        against naive: 0.998 on surge, incident and longtail with the token floor; 1.01-1.02
        with this one.)"""
        total = float(sum(sum(hc.warmable) for hc in ns.history.values()))
        if not total:
            return
        weight = PAST_BREAK_EVEN if self.cfg.min_value_ms is None else FALLBACK
        week_counts = self.profile.week_counts(ns.tenant, ns.model_id, ns.template_version)
        for q, n in week_counts.items():
            floor = weight * n / total * max(ns.volume, 1.0)
            if ns.hits.get(q, 0.0) < floor:
                ns.hits[q] = floor
                ns.per_hour.pop(q, None)  # spread as the window's volume is (hourly())

    def _recent(self, ns: NamespaceForecast, window: Window) -> tuple[dict[str, int], int]:
        """Counts per query in the `recent_hours` before the window, and their total."""
        if self.cfg.recent_hours <= 0:
            return {}, 0
        by_week: dict[int, list[int]] = {}
        for i in range(1, self.cfg.recent_hours + 1):
            week, how = week_and_hour(window.start - timedelta(hours=i))
            by_week.setdefault(week, []).append(how)
        hourly = ns.history
        seen = sum(hourly[w].warmable[h] for w, hs in by_week.items() if w in hourly for h in hs)
        counts: dict[str, int] = {}
        if seen:
            tenant, model_id, template = ns.tenant, ns.model_id, ns.template_version
            for week, hows in by_week.items():
                for st in self.profile.top_queries(tenant, model_id, template, hows, _ALL, [week]):
                    counts[st.qkey] = counts.get(st.qkey, 0) + st.count
        return counts, seen

    def _hourly(
        self, ns: NamespaceForecast, days: Sequence[date], today: date
    ) -> tuple[np.ndarray, list[str], np.ndarray, float]:
        """Counts per (query, hour of day) over `days`, each day weighted by its age before
        `today` (half-life `history_half_life_days`: last week counts half as much as this
        one, so a trend shows), the weighted totals of warmable requests per hour, and the
        sum of the day weights."""
        weight = self._day_weights(days, today)
        cells = [(*week_and_hour(_midnight(d)), d) for d in days]
        reads = [(week, how + h) for week, how, _ in cells for h in range(24)]
        got = self.profile.hour_cells(ns.tenant, ns.model_id, ns.template_version, reads)
        index: dict[str, int] = {}
        rows: list[tuple[int, int, float]] = []
        for n, cell in enumerate(got):
            day, h = cells[n // 24][2], n % 24
            for q, c in cell.items():
                rows.append((index.setdefault(q, len(index)), h, c * weight[day]))
        counts_m = np.zeros((len(index), 24))
        for i, h, wc in rows:
            counts_m[i, h] += wc
        totals, weights = self._totals(ns.history, days, today)
        return counts_m, list(index), totals, weights

    def _day_weights(self, days: Sequence[date], today: date) -> dict[date, float]:
        half = self.cfg.history_half_life_days
        return {d: 1.0 if half is None else 0.5 ** ((today - d).days / half) for d in days}

    def _totals(
        self, hourly: dict[int, HourlyCounts], days: Sequence[date], today: date
    ) -> tuple[np.ndarray, float]:
        """The weighted totals of warmable requests per hour of day over `days` (as _hourly
        weighs them), and the sum of the day weights."""
        weight = self._day_weights(days, today)
        totals = np.zeros(24)
        for d in days:
            week, how = week_and_hour(_midnight(d))
            if week in hourly:
                totals += weight[d] * np.asarray(hourly[week].warmable[how : how + 24], dtype=float)
        return totals, float(sum(weight.values()))

    def _share(
        self,
        counts: np.ndarray,
        totals: np.ndarray,
        hours: Sequence[int],
        background: float | None = None,
    ) -> np.ndarray:
        """Each query's smoothed share of the traffic at each window hour."""
        hod = np.arange(24)
        dist = np.abs(np.asarray(hours)[:, None] - hod[None, :])
        dist = np.minimum(dist, 24 - dist)
        bg = self.cfg.background if background is None else background
        w = np.exp(-(dist**2) / (2 * self.cfg.bandwidth_h**2)) + bg
        denom = w @ totals  # (hours,)
        denom[denom == 0] = 1.0
        out: np.ndarray = (counts @ w.T) / denom[None, :]
        return out

    def _background(self, ns: NamespaceForecast, days: Sequence[date]) -> float:
        """How much of a query's share comes from the rest of the day, chosen on the history
        itself: the latest of `days` is predicted from the others, hour by hour, with each
        candidate weight, and the best Poisson likelihood wins. Traffic whose mix follows
        the hour gets a small weight; traffic whose hours are noise gets a large one (a
        query's share of the whole day). Memoised per namespace and day."""
        grid = self.cfg.background_grid
        if len(grid) < 2 or len(days) < 3:
            return self.cfg.background
        held, rest = max(days), [d for d in days if d != max(days)]
        memo = ("bg", ns.tenant, ns.model_id, ns.template_version, held, len(rest))
        if memo in self._memo:
            return float(self._memo[memo])
        c_rest, q_rest, t_rest, _ = self._hourly(ns, rest, held)
        c_held, q_held, t_held, _ = self._hourly(ns, [held], held)
        where = {q: i for i, q in enumerate(q_rest)}
        best, best_ll = self.cfg.background, -np.inf
        for bg in grid:
            share = self._share(c_rest, t_rest, range(24), bg)  # (queries, 24)
            lam = share * t_held[None, :]
            ll = -float(lam.sum())
            for i, q in enumerate(q_held):
                j = where.get(q)
                y = c_held[i]
                rate = lam[j] if j is not None else np.zeros(24)
                ll += float((y * np.log(np.maximum(rate, 1e-3))).sum())
            if ll > best_ll:
                best, best_ll = bg, ll
        if len(self._memo) > 1024:
            self._memo.clear()
        self._memo[memo] = best
        return best


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _regime_name(regimes: DayRegimes, d: date) -> str:
    r = regimes.regime_of(d)
    return "all days" if r is None else regimes.describe(r)
