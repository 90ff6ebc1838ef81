"""Steps 1-2 of the hot set (warmers/hotset/select.py): each query's expected requests in a window.

Per (tenant, model, template): the past days of each window day's regime, the live log's
surges, the retained weeks' tail; per hour of the plan's span (the lead hours a send may go out
in, then the window) as well as summed over the window, with the namespace's forecast load per
span hour (what a warm is priced by).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np

from warmers.hotset.regimes import DayRegimes, cluster_days
from warmers.hotset.window import Window
from warmers.traffic.profile import HourlyCounts, TrafficProfile, daily_from, week_and_hour

if TYPE_CHECKING:
    from warmers.hotset.options import HotSetConfig

    # a namespace's queries -> their paraphrase group ids (the selector embeds their prompts)
    Grouping = Callable[["NamespaceForecast", list[str]], dict[str, int]]

# A query the matching days did not ask (or barely): its floor, as a share of its share of every
# retained week. With the value bar, a token share (it is ranked, not expected); ranked past
# break-even, all of it (PAST_BREAK_EVEN).
FALLBACK = 1e-3
PAST_BREAK_EVEN = 1.0
_ALL = 10**9  # "every query": top_queries sums whole hourly hashes, so the limit only trims


@dataclass
class NamespaceForecast:
    """One (tenant, model, template)'s expected hits for the window, and their hours over the
    plan's span: `start` lead hours, then the window's."""

    tenant: str
    model_id: str
    template_version: str
    history: dict[int, HourlyCounts]  # the weeks' hourly totals (profile.hourly_counts)
    load: np.ndarray  # expected warmable requests per span hour, in span order
    start: int = 0  # the window's first hour in the span
    hits: dict[str, float] = field(default_factory=dict)  # summed over the window
    # the requests of the queries the regimes forecast, per span hour: row index[q] of
    # `matrix` (the rest, and those in `spread`: `hourly`)
    index: dict[str, int] = field(default_factory=dict)
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    spread: set[str] = field(default_factory=set)
    volume: float = 0.0  # expected warmable requests in the window
    note: str = ""
    # the retained weeks' count per query and of all warmable requests (Forecaster._everything)
    everything: tuple[dict[str, int], float] | None = field(default=None, repr=False)

    def hourly(self, qkey: str) -> np.ndarray:
        """The query's expected requests per span hour: the regimes' own split, else (a surge,
        the fallback) its window hits spread in proportion to the span's hourly volume."""
        row = self.index.get(qkey)
        if row is not None and qkey not in self.spread:
            out_row: np.ndarray = self.matrix[row]
            return out_row
        total = float(self.load[self.start :].sum())
        n = len(self.load) - self.start
        shape = self.load / total if total > 0 else np.full(len(self.load), 1 / n)
        out: np.ndarray = self.hits.get(qkey, 0.0) * shape
        return out


class Forecaster:
    """Reads the profile; memoises what depends only on the past days."""

    def __init__(
        self, profile: TrafficProfile, config: HotSetConfig, group: Grouping | None = None
    ) -> None:
        """group: the paraphrase groups of a namespace's queries (query key -> group id), for
        the surges of many phrasings (_surging_groups); None: exact surges only."""
        self.profile = profile
        self.cfg = config
        self.group = group
        # Day clustering (KMeans + silhouette, ~0.5 s) depends only on the past days' counts:
        # memoised on them, so a scheduler planning every window re-clusters once a day.
        self._regimes: dict[tuple[object, ...], DayRegimes] = {}
        self._memo: dict[tuple[object, ...], tuple[float, float]] = {}
        # hour cells of the days before `_cells_day`, read once (_cells)
        self._cells_day: date | None = None
        self._cell_memo: dict[tuple[object, ...], dict[str, int]] = {}

    def expected_hits(
        self,
        tenant: str,
        model_id: str,
        template: str,
        window: Window,
        lead: int = 0,
        named: bool = False,
    ) -> NamespaceForecast:
        """The window's forecast, over a span that starts `lead` hours before it; `named`: for
        a named budget, ranked past break-even (_fallback)."""
        # one read of the weeks' hourly totals serves every step of this plan
        hourly = self.profile.hourly_counts(tenant, model_id, template)
        span = Window(window.start - timedelta(hours=lead), window.end)
        today = span.start.date()
        regimes = self._day_regimes(tenant, model_id, template, hourly, today)
        ns = NamespaceForecast(tenant, model_id, template, hourly, np.zeros(span.hours()), lead)
        at = {slot: k for k, slot in enumerate(span.slots())}
        by_day: dict[date, list[int]] = {}
        for d, h in span.slots():
            by_day.setdefault(d, []).append(h)
        notes = set()
        parts: list[tuple[list[str], list[int], np.ndarray]] = []  # a day's queries, columns
        for d, hours in by_day.items():
            days = regimes.matching_days(d)
            if not days:
                continue
            counts, qkeys, totals, weight = self._hourly(ns, days, today)
            bg, prior = self._smoothing(ns, days)
            base = self._base_share(ns, qkeys) if prior else None
            share = self._share(counts, totals, hours, bg, base, prior)  # (queries, len(hours))
            per_hour_volume = totals[hours] / weight
            cols = [at[(d, h)] for h in hours]
            inside = np.asarray(cols) >= lead
            ns.volume += float(per_hour_volume[inside].sum())
            ns.load[cols] += per_hour_volume
            parts.append((qkeys, cols, share * per_hour_volume))
            notes.add(f"{_regime_name(regimes, d)} ({len(days)} days)")
        self._gather(ns, parts)
        ns.note = ", ".join(sorted(notes)) or "no history"
        self._fallback(ns, named)
        ns.note += self._surges(ns, window)
        return ns

    def _gather(
        self, ns: NamespaceForecast, parts: list[tuple[list[str], list[int], np.ndarray]]
    ) -> None:
        """The days' (queries x their hours) expected requests into one (queries x span)
        matrix, and each query's hits summed over the window's hours."""
        for qkeys, _, _ in parts:
            for q in qkeys:
                ns.index.setdefault(q, len(ns.index))
        ns.matrix = np.zeros((len(ns.index), len(ns.load)))
        for qkeys, cols, split in parts:
            rows = np.fromiter((ns.index[q] for q in qkeys), dtype=np.int64, count=len(qkeys))
            ns.matrix[np.ix_(rows, np.asarray(cols))] += split
        window = ns.matrix[:, ns.start :].sum(axis=1)
        ns.hits = dict(zip(ns.index, window.tolist(), strict=True))

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
        surging, rising = 0, {}
        for q, c in recent.items():
            now = c / seen * ahead  # at its share of the last hours
            if now <= self.cfg.recent_surge * ns.hits.get(q, 0.0):
                continue
            if c >= self.cfg.recent_min_count:
                surging += self._expect(ns, q, now)
            else:
                rising[q] = (c, now)
        grouped = sum(self._expect(ns, q, now) for q, now in self._surging_groups(ns, rising))
        with_groups = f", {grouped} with their paraphrases" if grouped else ""
        return (
            f" + the last {self.cfg.recent_hours} h ({seen} requests, {surging} surging"
            f"{with_groups})"
        )

    @staticmethod
    def _expect(ns: NamespaceForecast, qkey: str, requests: float) -> int:
        ns.hits[qkey] = requests
        ns.spread.add(qkey)
        return 1

    def _surging_groups(
        self, ns: NamespaceForecast, rising: dict[str, tuple[int, float]]
    ) -> list[tuple[str, float]]:
        """The rising queries (asked more than their forecast share, too few times each to
        surge alone) whose paraphrases, together, are asked `recent_min_count` times: an
        incident comes as many phrasings of one question, each asked once or twice, which no
        exact count sees surge. Grouped by `group` (the selector's: the prompts' cosine),
        groups of two or more; (query, its recent requests) of each member."""
        if self.group is None or len(rising) < 2:
            return []
        groups: dict[int, list[str]] = {}
        for q, g in self.group(ns, sorted(rising)).items():
            groups.setdefault(g, []).append(q)
        out = []
        for members in groups.values():
            if (
                len(members) >= 2
                and sum(rising[q][0] for q in members) >= self.cfg.recent_min_count
            ):
                out += [(q, rising[q][1]) for q in members]
        return out

    def _fallback(self, ns: NamespaceForecast, named: bool = False) -> None:
        """Whatever the retained weeks asked, at any hour of any day, by how much: a floor of
        its share of those weeks x the window's volume, times FALLBACK (under every query the
        forecast really expects: a query the matching days never asked is ranked, by how much
        it was asked at all, not expected), or, ranked past break-even (a budget of K buys K
        items), times PAST_BREAK_EVEN: the budget's tail goes to the most asked, as a naive
        top-K's would, not to the one-offs of the matching days. (bench hot_set_shapes, K=1000,
        against naive: 0.998 on surge, incident and longtail with the token floor; 1.01-1.02
        with this one.)"""
        week_counts, total = self._everything(ns)
        if not total:
            return
        weight = PAST_BREAK_EVEN if named or self.cfg.min_value_ms is None else FALLBACK
        for q, n in week_counts.items():
            floor = weight * n / total * max(ns.volume, 1.0)
            if ns.hits.get(q, 0.0) < floor:
                ns.hits[q] = floor
                ns.spread.add(q)  # spread as the window's volume is (hourly())

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
        got = self._cells(ns, reads, [d for _, _, d in cells for _ in range(24)])
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

    def _cells(
        self, ns: NamespaceForecast, reads: list[tuple[int, int]], days: list[date]
    ) -> list[dict[str, int]]:
        """profile.hour_cells, the cells of days before the clock's day read once per day: a
        scheduler plans every 15 minutes, and a past day's cells change only by a late event
        (read again from the next day on)."""
        today = self.profile.clock().date()
        if self._cells_day != today:
            self._cells_day, self._cell_memo = today, {}
        ns_key = (ns.tenant, ns.model_id, ns.template_version)
        todo = [
            i for i, (r, d) in enumerate(zip(reads, days, strict=True))
            if d >= today or (*ns_key, *r) not in self._cell_memo
        ]  # fmt: skip
        fresh = self.profile.hour_cells(*ns_key, [reads[i] for i in todo]) if todo else []
        got: dict[int, dict[str, int]] = dict(zip(todo, fresh, strict=True))
        out = []
        for i, (r, d) in enumerate(zip(reads, days, strict=True)):
            cell = got.get(i)
            if cell is None:
                cell = self._cell_memo[(*ns_key, *r)]
            elif d < today:
                self._cell_memo[(*ns_key, *r)] = cell
            out.append(cell)
        return out

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
        base: np.ndarray | None = None,
        prior: float = 0.0,
    ) -> np.ndarray:
        """Each query's smoothed share of the traffic at each window hour. With `base` (each
        query's share of the whole history) and a `prior` of so many of the query's own asks,
        its share is shrunk toward the base in proportion to how little its neighbourhood of
        the hour holds: a Gamma prior of mean base and shape `prior` makes it (asks near the
        hour + prior) / (requests near the hour + prior / base). A query asked once near the
        hour is expected near its whole-history share; one asked there hundreds of times keeps
        its own share (half way where it was asked `prior` times more than its base says)."""
        hod = np.arange(24)
        dist = np.abs(np.asarray(hours)[:, None] - hod[None, :])
        dist = np.minimum(dist, 24 - dist)
        bg = self.cfg.background if background is None else background
        w = np.exp(-(dist**2) / (2 * self.cfg.bandwidth_h**2)) + bg
        denom = w @ totals  # (hours,)
        num = counts @ w.T  # (queries, hours)
        if base is not None and prior > 0:
            known = base > 0  # a query the weeks' summary lost keeps its own share
            pseudo = np.where(known, prior / np.where(known, base, 1.0), 0.0)
            d = denom[None, :] + pseudo[:, None]
            d[d == 0] = 1.0
            out: np.ndarray = (num + prior * known[:, None]) / d
            return out
        denom[denom == 0] = 1.0
        out = num / denom[None, :]
        return out

    def _base_share(self, ns: NamespaceForecast, qkeys: Sequence[str]) -> np.ndarray:
        """Each query's share of every request the retained weeks hold (any hour, any day)."""
        counts, total = self._everything(ns)
        return np.asarray([counts.get(q, 0) for q in qkeys], dtype=float) / max(total, 1.0)

    def _everything(self, ns: NamespaceForecast) -> tuple[dict[str, int], float]:
        """The retained weeks' count of each query and of every warmable request (read once
        per namespace and plan)."""
        if ns.everything is None:
            total = float(sum(sum(hc.warmable) for hc in ns.history.values()))
            counts = self.profile.week_counts(ns.tenant, ns.model_id, ns.template_version)
            ns.everything = (counts, total)
        return ns.everything

    def _smoothing(self, ns: NamespaceForecast, days: Sequence[date]) -> tuple[float, float]:
        """How much of a query's share comes from the rest of the day, and how many of its own
        asks' worth its hour's share is shrunk toward its whole-history share by, chosen on the
        history itself: the latest of `days` is predicted from the others, hour by hour, with
        each candidate pair, and the best Poisson likelihood wins. Traffic whose mix follows
        the hour gets a small background; traffic whose hours are noise a large one (a query's
        share of the whole day); thin history (a week, a night hour), a strong prior. Memoised
        per namespace and day."""
        grid, priors = self.cfg.background_grid, self.cfg.prior_grid
        if (len(grid) < 2 and len(priors) < 2) or len(days) < 3:
            return self.cfg.background, self.cfg.prior_asks
        held, rest = max(days), [d for d in days if d != max(days)]
        memo = ("bg", ns.tenant, ns.model_id, ns.template_version, held, len(rest))
        if memo in self._memo:
            return self._memo[memo]
        c_rest, q_rest, t_rest, _ = self._hourly(ns, rest, held)
        c_held, q_held, t_held, _ = self._hourly(ns, [held], held)
        base = self._base_share(ns, q_rest) if any(priors) else None
        where = {q: i for i, q in enumerate(q_rest)}
        seen = np.asarray([where.get(q, -1) for q in q_held])
        known, y_known = seen[seen >= 0], c_held[seen >= 0]
        y_new = c_held[seen < 0]
        best, best_ll = (self.cfg.background, self.cfg.prior_asks), -np.inf
        for bg in grid or (self.cfg.background,):
            for prior in priors or (self.cfg.prior_asks,):
                share = self._share(c_rest, t_rest, range(24), bg, base, prior)  # (queries, 24)
                lam = share * t_held[None, :]
                ll = -float(lam.sum())
                ll += float((y_known * np.log(np.maximum(lam[known], 1e-3))).sum())
                ll += float(y_new.sum()) * math.log(1e-3)
                if ll > best_ll:
                    best, best_ll = (bg, prior), ll
        if len(self._memo) > 1024:
            self._memo.clear()
        self._memo[memo] = best
        return best


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _regime_name(regimes: DayRegimes, d: date) -> str:
    r = regimes.regime_of(d)
    return "all days" if r is None else regimes.describe(r)
