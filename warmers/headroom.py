"""The headroom a warm may spend: the capacity under the busiest hour, less the hour's own load.

A warm moves GPU work out of the hours it prepares into the hour it is sent in. Sent in an hour
that is itself busy, it makes the peak it exists to flatten: a deploy's pre-warm, sized to a
hit bar and sent in the hour before the cutover, did exactly that. So every hour a warm runs in
has a cap, in GPU-seconds: the ceiling (the busiest hour the traffic is forecast to bring
without warming) minus the live GPU forecast for that hour, never below zero.

The forecast is of volume; what else takes load off the model server this week (semantic hits,
the warms of earlier hours) it cannot know. So the hour's forecast is read against the load the
server reported in the hours just served (its busy seconds, backends/engine.py): the live
forecast times `load_ratio` (served over forecast, `TREND_HOURS` back, bounded). A week that
runs lighter than its forecast leaves more room under the same ceiling; one that runs heavier,
less. The ceiling stays the forecast's: the capacity its busiest hour calls for.

What does not fit under one hour's cap waits for the next send hour, or is left out: a
scheduled warm keeps, in rank order, the items that fit (`cap_plan`); the deploy's pre-warm
cuts over at the bar what fitted reached (warmers/prewarm.py).

The forecast is the traffic profile's (`ProfileHeadroom`): per namespace, the requests of each
hour of the week that reach the GPU, times what one costs, over the complete weeks retained.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis

from caches.boundary import redis_boundary
from caches.keys import LOAD_RATIO_KEY
from schemas.common import utcnow
from schemas.errors import CacheUnavailable, ConfigError
from warmers.hotset.plan import cap_plan, sent_gpu_s
from warmers.hotset.warm_budget import Budget
from warmers.runner import WarmRunner
from warmers.shadow import WarmSummary
from warmers.traffic.profile import HOURS_PER_WEEK, TrafficProfile, week_and_hour

_EPS = 1e-9
log = logging.getLogger("warmers.scheduler")

# How many hours back the served load is read against the forecast (`load_ratio`) ...
TREND_HOURS = 3
# ... how far the ratio may move the forecast (a few quiet or busy minutes, or a server that
# also serves what the profile does not count, must not empty or fill the room) ...
RATIO_BOUNDS = (0.5, 2.0)
# ... and the least forecast GPU-seconds, and the least time, it is read over: under them, the
# forecast stands.
MIN_FORECAST_GPU_S = 1.0
RATIO_MIN_SPAN = timedelta(minutes=30)


def load_ratio(served_gpu_s: float, forecast_gpu_s: float) -> float | None:
    """How the hours just served ran against their forecast: served over forecast GPU-seconds,
    within RATIO_BOUNDS; None when the forecast is under MIN_FORECAST_GPU_S (nothing to read
    a ratio from) or the served load is unknown (negative: a counter that went back)."""
    if forecast_gpu_s < MIN_FORECAST_GPU_S or served_gpu_s < 0:
        return None
    lo, hi = RATIO_BOUNDS
    return min(hi, max(lo, served_gpu_s / forecast_gpu_s))


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

    def cap(self, hour: int, ratio: float = 1.0) -> float:
        """What warms sent in `hour` may spend, in GPU-seconds (0 in an hour at the ceiling):
        the forecast, the hour's and the ceiling's alike, read times `ratio` (load_ratio). A
        forecast learned from a log of misses (no cache in front, or one colder than today's)
        puts the peak well above what the servers carry now; read at its own level only, the
        hour's room filled a quiet hour up to that old peak, above today's."""
        return max(0.0, ratio * (self.ceiling_gpu_s - self.live_gpu_s(hour)))


def profile_live_gpu(
    profile: TrafficProfile, before_week: int, model_id: str | None = None, cold: bool = False
) -> list[float] | None:
    """Live GPU-seconds per hour of week (0 = Monday 00:00 UTC) that the profile forecasts for
    `model_id` (None: every model), summed over its tenants and templates: per namespace, the
    mean over its retained weeks before `before_week` (complete ones: the week under way has
    not had its busy hours yet) of each hour's requests that reach the GPU, times the mean
    GPU time of one. The warmable requests reach it at the share the tracked queries' misses
    say (a query evicted from the week's summary loses its misses, so the share, and the
    room, err low); the never-cacheable ones all do; `cold`: every request does (a new model
    version's first hours, before any of its entries exists). None when no namespace has such
    a week.
    """
    out, known = [0.0] * HOURS_PER_WEEK, False
    for tenant in profile.tenants():
        for model, template in profile.namespaces(tenant):
            if model_id is not None and model != model_id:
                continue
            hourly = profile.hourly_counts(tenant, model, template)
            weeks = [w for w in hourly if w < before_week]
            cost = profile.miss_totals(tenant, model, template, weeks)
            warmable = sum(sum(hourly[w].warmable) for w in weeks)
            if not cost.misses or not warmable:
                continue  # no request of these weeks reached the GPU: no cost to go by
            known = True
            share = 1.0 if cold else min(1.0, cost.misses / warmable)
            per_req_s = cost.gpu_ms_per_miss / 1000.0 / len(weeks)
            for w in weeks:
                hc = hourly[w]
                for h in range(HOURS_PER_WEEK):
                    out[h] += (hc.warmable[h] * share + hc.uncacheable[h]) * per_req_s
    return out if known else None


def forecast_between(live_gpu_s: Sequence[float], start: datetime, end: datetime) -> float:
    """The GPU-seconds a per-hour-of-week forecast (profile_live_gpu) gives `start`..`end`,
    each hour's share by the part of it the span covers."""
    total, t = 0.0, start
    while t < end:
        top = datetime.fromtimestamp(t.timestamp() // 3600 * 3600 + 3600, UTC)
        nxt = min(end, top)
        total += live_gpu_s[week_and_hour(t)[1]] * (nxt - t).total_seconds() / 3600.0
        t = nxt
    return total


class SharedRatio:
    """The load ratio one process read, for the others. The scheduler's leader reads the
    server all day; the deploy worker reads its room once per deploy and has no readings of
    its own to read a ratio from. Kept `ttl_s` in Redis (two of the scheduler's 15-minute
    runs): a leader that stopped reading lets it lapse, and the forecast stands. A Redis that
    fails says nothing and keeps nothing."""

    def __init__(self, r: redis.Redis, ttl_s: float = 1800.0, key: str = LOAD_RATIO_KEY) -> None:
        self.redis, self.ttl_ms, self.key = r, int(ttl_s * 1000), key

    def put(self, ratio: float) -> None:
        with contextlib.suppress(CacheUnavailable), redis_boundary("load ratio put"):
            self.redis.set(self.key, repr(ratio), px=self.ttl_ms)

    def get(self) -> float | None:
        raw = None
        with contextlib.suppress(CacheUnavailable), redis_boundary("load ratio get"):
            raw = self.redis.get(self.key)
        try:
            got = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            return None
        lo, hi = RATIO_BOUNDS
        return got if got is not None and lo <= got <= hi else None


class ProfileHeadroom:
    """The scheduler's and the deploy's headroom: what warms may still send to a model in the
    hour under way, under `share` of the busiest hour the profile forecasts for that model
    (profile_live_gpu, read again each hour: each model's servers are a pool of their own),
    less what this process's warms already sent to it in the hour (`spend`). A new leader
    starts the hour with nothing spent: at worst one hour's room is spent twice.

    With `busy` (the warm backend's busy seconds so far, backends/engine.py; None when it does
    not say), the hour's forecast is read against the load the server carried since the oldest
    of its readings in the last TREND_HOURS (`ratio`): its busy seconds less what this
    process's warms sent, over what the profile forecast for every model in that time. With
    `shared`, a ratio read is kept there, and one without readings enough reads it there."""

    def __init__(
        self,
        profile: TrafficProfile,
        share: float = 1.0,
        clock: Callable[[], datetime] = utcnow,
        busy: Callable[[], float | None] | None = None,
        shared: SharedRatio | None = None,
    ) -> None:
        if not 0.0 < share <= 1.0:
            raise ConfigError(f"headroom share must lie in (0, 1], got {share}")
        self.profile, self.share, self.clock, self.busy = profile, share, clock, busy
        self.shared = shared
        self._hour: tuple[int, int] | None = None  # (week, hour of week) of what follows
        self._rooms: dict[str | None, Headroom | None] = {}
        # each model's forecast (None: every model) for the hour under way: read once per hour
        self._forecasts: dict[tuple[str | None, bool], list[float] | None] = {}
        self.spent: dict[str | None, float] = {}
        self.sent_total = 0.0  # GPU-s this process's warms sent, every hour and model
        # (time, the server's busy seconds, sent_total) at each reading of the last TREND_HOURS
        self._readings: deque[tuple[datetime, float, float]] = deque(maxlen=1024)
        self._ratio: tuple[datetime, float] | None = None

    def left(self, model_id: str | None = None, *, cold: bool = False) -> float | None:
        """GPU-seconds the hour under way has left for warms to `model_id` (None: every model
        as one pool); None while the profile holds no complete week of it: no peak is known
        yet, and the warm goes uncapped. `cold`: the hour a new version goes live in (the
        deploy's pre-warm), whose every request misses: its load is the forecast with no entry
        cached, under the ceiling read at the load served. A pre-warm held only to the
        hour's usual load filled the room the cold namespace's own misses took, and a deploy
        at noon made the week's peak."""
        week, how = self._roll()
        room = self._room(week, model_id)
        if room is None:
            return None
        ratio = self.ratio()
        if cold:
            misses = self._live(week, model_id, cold=True)
            cap = max(0.0, ratio * room.ceiling_gpu_s - (misses[how] if misses else 0.0))
        else:
            cap = room.cap(how, ratio)
        return max(0.0, cap - self.spent.get(model_id, 0.0))

    def spend(self, gpu_s: float, model_id: str | None = None) -> None:
        self._roll()
        self.spent[model_id] = self.spent.get(model_id, 0.0) + gpu_s
        self.sent_total += gpu_s

    def ratio(self) -> float:
        """load_ratio of the load served since the oldest reading of the last TREND_HOURS (read
        at most once a minute); 1.0, the forecast as it is, without `busy`, without a reading
        RATIO_MIN_SPAN old, or while the server says nothing. A counter that went back (a
        restarted server) starts the readings again."""
        if self.busy is None:
            return 1.0
        week, _ = self._roll()
        now = self.clock()
        if self._ratio is not None and now - self._ratio[0] < timedelta(minutes=1):
            return self._ratio[1]
        got, busy = None, self.busy()
        rs = self._readings
        if busy is None or (rs and busy < rs[-1][1]):
            rs.clear()
        if busy is not None:
            rs.append((now, busy, self.sent_total))
            while now - rs[0][0] > timedelta(hours=TREND_HOURS):
                rs.popleft()
            t0, busy0, sent0 = rs[0]
            live = self._live(week, None)
            if now - t0 >= RATIO_MIN_SPAN and live is not None:
                served = busy - busy0 - (self.sent_total - sent0)
                got = load_ratio(served, forecast_between(live, t0, now))
        if self.shared is not None:
            if got is not None:
                self.shared.put(got)
            else:
                got = self.shared.get()
        r = 1.0 if got is None else got
        self._ratio = (now, r)
        return r

    def _room(self, week: int, model_id: str | None) -> Headroom | None:
        if model_id not in self._rooms:
            live = self._live(week, model_id)
            room = None if live is None else Headroom.under_peak(live, 0, self.share)
            self._rooms[model_id] = room
        return self._rooms[model_id]

    def _live(self, week: int, model_id: str | None, cold: bool = False) -> list[float] | None:
        key = (model_id, cold)
        if key not in self._forecasts:
            live = profile_live_gpu(self.profile, week, model_id, cold)
            self._forecasts[key] = live
        return self._forecasts[key]

    def _roll(self) -> tuple[int, int]:
        """The hour under way; a new one forgets the last one's forecast and spending."""
        hour = week_and_hour(self.clock())
        if self._hour != hour:
            self._hour, self._rooms, self._forecasts, self.spent = hour, {}, {}, {}
        return hour


class ScheduledWarm:
    """The scheduler's warm job: plan the hours ahead (WarmRunner.plan_ahead: each entry in its
    cheapest hour before it is asked) and send to each model what is due now and the hour
    under way has room for (`room`, ProfileHeadroom; None: no cap), counting it there."""

    def __init__(self, runner: WarmRunner, budget: Budget, room: ProfileHeadroom | None) -> None:
        self.runner, self.budget, self.room = runner, budget, room
        self.last_plan = self.last_deferred = 0  # the last run's items due, and deferred

    def __call__(self) -> WarmSummary:
        plan = self.runner.plan_ahead(self.budget)
        self.last_plan, self.last_deferred = len(plan.items), len(plan.deferred)
        room, models = self.room, sorted({i.model_id for i in plan.items})
        rooms: dict[str, float] = {}
        if room is not None:
            for m in models:
                left = room.left(m)
                if left is not None:
                    rooms[m] = left
                    cap_plan(plan, left, m)
        summary = self.runner.warm(plan, labels={"by": "scheduler"})
        if room is not None:
            for m in models:
                room.spend(sent_gpu_s(plan, summary.sent_keys, m), m)
        # A run that sent nothing is routine (every 15 min, mostly): DEBUG, not a line of INFO.
        level = logging.INFO if summary.sent or summary.failed else logging.DEBUG
        under = ", ".join(f"{m} {v:.1f}" for m, v in rooms.items())
        if under and room is not None and room.busy is not None:
            under += f" GPU-s; the server carrying {room.ratio():.2f}x its forecast"
        elif under:
            under += " GPU-s"
        under = f" under the headroom ({under})" if under else ""
        log.log(
            level, "warmed %s: %d due now, %d deferred%s, %s", plan.window, len(plan.items),
            len(plan.deferred), under, summary,
        )  # fmt: skip
        return summary
