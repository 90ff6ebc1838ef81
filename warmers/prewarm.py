"""Deploy pre-warm: fill a new model version's namespace until the first hours reach a hit bar.

The traffic profile keys queries by model id and template, not version (on purpose), so what
was learned under `previous_version` is exactly the hot set the new version will be asked in
the coming window. The plan is made with model_version=`version`: every warm item's cache
identity names the new namespace, the freshness check looks there, and nothing lands under the
old one. The old version's entries are the cutover job's business (grace, then purge).

Sizing, in order:
1. plan the window (the hour under way and the `hours` - 1 after it) with the warm budget as
   the ceiling, as `stoker warm` does, but valued by hits whatever the selector's value model:
   the bar counts every hit of a warmed entry, and "prevented" would leave out the hot
   entries a flat load does not pay to warm, which are the ones that reach it;
2. project its hit rate: the expected hits of its items (and of what is cached already) over
   the window's expected warmable requests (Plan.hit_share says what that counts);
3. keep items in rank order only until the projection reaches `hit_bar`: each tenant's own
   items up to its own bar first (the budget's fair split stays fair: a flooding tenant
   cannot take the whole pre-warm), then the best of the rest if the total is still short;
4. warm what is kept; then `reached` = the expected hits of the items whose entry is in the
   new namespace (landed now, or cached before), over the same volume.

READY (`ok`) means the bar was met: reached >= hit_bar. When the whole budget's plan cannot
project the bar (a long tail the profile cannot warm, a budget too small), the whole plan is
warmed and the bar is reported unreachable with the reachable figure; READY then needs
`min_share` of that reachable figure in place, so a backend refusing most sends still fails
the deploy, while traffic that no pre-warm could serve does not block every deploy. No
traffic expected in the window (nothing learned): READY, the cache fills from live traffic.

Held to the headroom (`room`, warmers/headroom.py: ProfileHeadroom, when the scheduler's cap is
on): a pre-warm sent in a busy hour makes the peak it prepares for. So after sizing, the plan
keeps only what fits in the room the hour under way has left under the forecast peak (its best
item at least: one send is within any hour's noise, and it is what finds a backend that is
not there). When
that leaves items out, the bar READY stands for is what the room let in: `min_share` of the
projection of what was kept. The cutover goes ahead at the smaller bar, and the scheduler warms
the new version's rest behind READY, hour by hour, under the same headroom.

A backend that refuses connections stops the warm at once (its client's circuit), and the
pre-warm raises BackendUnreachable naming the URL: the cutover fails the deploy with that line
instead of retrying a pre-warm that cannot land anything.

Synchronous (the warm runs its own event loop): call it from a worker thread, not from inside
a running event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import BackendUnreachable, ConfigError
from schemas.prewarm import PrewarmRequest
from warmers.hotset.plan import Plan, PlanItem, Skipped, cap_plan, sent_gpu_s
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window
from warmers.runner import WarmRunner

# The first three hours after cutover: the ones that start cold; entries live a day by
# default, and past the first hours live traffic has filled what the forecast missed.
DEFAULT_HOURS = 3
MAX_HOURS = 24  # past a day the default TTL has expired what the pre-warm put in
# Projected share of the window's warmable requests served by warmed entries. On the demo's
# sample log the pre-deploy hit rate is about 50%; 30% keeps the cutover from starting cold
# without spending the whole budget on queries live traffic fills after their first miss.
DEFAULT_HIT_BAR = 0.3
# When the bar cannot be reached: the share of the reachable figure that must be in place.
# Half: a few backend errors or stale refusals do not fail a deploy; a backend that refuses
# most sends does.
DEFAULT_MIN_SHARE = 0.5
_EPS = 1e-9


class PrewarmOptions(BaseModel):
    """The owner of the deploy_prewarm_* settings' defaults and bounds (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hours: int = Field(default=DEFAULT_HOURS, ge=1, le=MAX_HOURS)
    hit_bar: float = Field(default=DEFAULT_HIT_BAR, gt=0.0, le=1.0)
    min_share: float = Field(default=DEFAULT_MIN_SHARE, ge=0.0, le=1.0)


class Room(Protocol):
    """The headroom warms to a model may spend in the hour under way (warmers/headroom.py)."""

    # GPU-s; None: no cap; cold: the hour's load as if nothing were cached (a new version)
    def left(self, model_id: str | None = None, *, cold: bool = False) -> float | None: ...

    def spend(self, gpu_s: float, model_id: str | None = None) -> None: ...


@dataclass(frozen=True)
class HotSetPrewarm:
    """What one pre-warm did (invalidators.deployjob.PrewarmReport reads part of it).
    Shares are of the window's expected warmable requests (`expected_requests`)."""

    model_id: str
    version: str
    previous_version: str | None
    tenants: tuple[str, ...]  # asked for; () = every tenant in the profile
    window: str
    planned: int  # items kept to reach the bar (all the budget allowed, if it cannot)
    sent: int
    cached: int
    skipped: int  # already cached with TTL left, uncacheable, or recently failed
    failed: int
    refused_stale: int  # the version was retired (or a context invalidated) while warming
    gpu_seconds: float
    already_cached: int = 0  # of the skipped, in the new namespace already
    hit_bar: float = DEFAULT_HIT_BAR
    min_share: float = DEFAULT_MIN_SHARE
    in_budget: int = 0  # items the budget allowed, before sizing to the bar
    expected_requests: float = 0.0
    projected: float = 0.0  # what the kept items (and the fresh ones) are expected to serve
    reachable: float = 0.0  # the same for the whole budget's plan
    reached: float = 0.0  # the same for the items in the new namespace after the run
    # what the sent items cost the GPU when they missed, by the profile's learned miss cost
    # (a time-compressed simulator's own gpu_seconds understate it)
    sent_miss_gpu_s: float = 0.0
    held: int = 0  # items the bar needed that the hour's headroom left out
    room_gpu_s: float | None = None  # the room the hour had left, when it was asked

    @property
    def warmed(self) -> int:
        return self.cached

    @property
    def bar_reachable(self) -> bool:
        return self.reachable >= self.hit_bar - _EPS

    @property
    def ok(self) -> bool:
        """The bar was met; or it cannot be (see the module docstring) and min_share of the
        reachable figure is in place; or no traffic is expected to warm for."""
        if self.expected_requests <= 0:
            return True
        if self.held:
            need = self.min_share * self.projected
        else:
            need = self.hit_bar if self.bar_reachable else self.min_share * self.reachable
        return self.reached >= need - _EPS

    @property
    def figures(self) -> str:
        if self.expected_requests <= 0:
            return (
                "no traffic expected in the window: the profile holds no request of these hours "
                "on the days before today (it forecasts by hour of the week, so today's traffic "
                "counts from tomorrow); the cache fills from live traffic, or replay a log of "
                "past days (stoker replay) to warm from it"
            )
        if self.held:
            return (
                f"held to the hour's headroom ({self.room_gpu_s or 0.0:.1f} GPU-s left under "
                f"the peak, {self.held} sends left to the scheduler): hit rate projected "
                f"{self.projected:.1%}, reached {self.reached:.1%} (bar {self.hit_bar:.1%})"
            )
        if self.bar_reachable:
            return (
                f"hit rate projected {self.projected:.1%}, reached {self.reached:.1%} "
                f"(bar {self.hit_bar:.1%})"
            )
        return (
            f"hit rate bar {self.hit_bar:.1%} unreachable: the whole plan projects "
            f"{self.reachable:.1%}, reached {self.reached:.1%} (need {self.min_share:.0%} of it)"
        )

    @property
    def detail(self) -> str:
        head = (
            f"pre-warmed {self.version}" if self.ok else f"pre-warm of {self.version} below its bar"
        )
        return (
            f"{head} for {self.window}: {self.figures}; {self.expected_requests:.0f} requests "
            f"expected; planned {self.planned} of {self.in_budget} in budget, sent {self.sent}, "
            f"cached {self.cached}, skipped {self.skipped}, failed {self.failed}, "
            f"{self.gpu_seconds:.1f} GPU-s"
        )


class HotSetPrewarmer:
    """The deploy cutover's pre-warm step (invalidators.deployjob.Prewarmer) on a WarmRunner:
    the same selection and shadow warmer as `stoker warm`, sized to a hit bar."""

    def __init__(
        self,
        runner: WarmRunner,
        budget: Budget,
        window: Callable[[], Window] | None = None,
        *,
        hours: int = DEFAULT_HOURS,
        hit_bar: float = DEFAULT_HIT_BAR,
        min_share: float = DEFAULT_MIN_SHARE,
        room: Room | None = None,
    ) -> None:
        if not 0.0 < hit_bar <= 1.0:
            raise ConfigError(f"pre-warm hit bar must lie in (0, 1], got {hit_bar}")
        if not 0.0 <= min_share <= 1.0:
            raise ConfigError(f"pre-warm min share must lie in [0, 1], got {min_share}")
        if not 1 <= hours <= MAX_HOURS:
            raise ConfigError(f"pre-warm window must be 1 to {MAX_HOURS} hours, got {hours}")
        self.runner, self.budget = runner, budget
        # the hour under way on the planner's clock (the wall clock's, or a replay's)
        clock = runner.selector.profile.clock
        self.window = window or (lambda: Window.from_this_hour(hours, clock()))
        self.hit_bar, self.min_share, self.room = hit_bar, min_share, room

    def prewarm(self, req: PrewarmRequest) -> HotSetPrewarm:
        """Plan, size to the bar, warm, measure; tenants None or empty = every tenant in the
        profile. Safe to run twice: what the first run cached counts as fresh in the second,
        so a retry sends only what is still missing for the bar."""
        model_id, version = req.model_id, req.version
        tenants = tuple(req.tenants or ())
        win = self.window()
        plan = self.runner.plan(
            win, self.budget, tenants=tenants or None, model_id=model_id, model_version=version,
            value_model="hits",
        )  # fmt: skip
        in_budget = len(plan.items)
        reachable = plan.hit_share([*plan.fresh, *plan.items])
        if reachable >= self.hit_bar - _EPS:
            size_to_bar(plan, self.hit_bar)
        room = None if self.room is None else self.room.left(model_id, cold=True)
        sized = len(plan.items)
        if room is not None and plan.items:
            # the best item at least, whatever the room: one send is within any hour's noise,
            # and it is what tells a backend that is not there (the deploy fails naming it)
            cap_plan(plan, max(room, plan.items[0].warm_cost_ms / 1000.0))
        projected = plan.hit_share([*plan.fresh, *plan.items])
        s = self.runner.warm(plan, labels={"model_id": model_id, "version": version})
        if self.room is not None:
            self.room.spend(sent_gpu_s(plan, s.sent_keys), model_id)
        if s.unreachable:  # no item could land: the job says where it could not connect
            raise BackendUnreachable(f"pre-warm of {version}: {s.unreachable}")
        reached = plan.hit_share(self._in_place([*plan.fresh, *plan.items]))
        return HotSetPrewarm(
            model_id, version, req.previous_version, tenants, str(win), len(plan.items),
            s.sent, s.cached, s.skipped,
            s.failed, s.refused_stale, s.gpu_seconds, s.skipped_cached, self.hit_bar,
            self.min_share, in_budget, plan.expected_volume, projected, reachable, reached,
            sum(i.miss_cost_ms for i in plan.items[: s.sent]) / 1000.0,
            sized - len(plan.items), room,
        )  # fmt: skip

    __call__ = prewarm

    def _in_place(self, items: list[PlanItem]) -> list[PlanItem]:
        """The items whose exact entry is in the target namespace now, as the planner sees the
        cache (one pipelined PTTL on Redis; a replay's virtual cache)."""
        if not items:
            return []
        keys = [i.item.identity.key().exact() for i in items]
        left = self.runner.selector.freshness.ttl_left_ms(keys)
        return [i for i, ms in zip(items, left, strict=True) if ms != -2]


def size_to_bar(plan: Plan, bar: float) -> None:
    """Keep plan.items (in rank order) only until the projection reaches `bar`: each tenant's
    items until its own share does, then the best of the rest until the total does. What is
    left out is noted in plan.skipped. The fresh items count from the start."""
    keep: set[int] = set()
    for tenant, vol in plan.volume.items():
        got = sum(i.expected_hits for i in plan.fresh if i.tenant == tenant)
        for i in (i for i in plan.items if i.tenant == tenant):
            if got >= bar * vol - _EPS:
                break
            keep.add(id(i))
            got += i.expected_hits
    need = bar * plan.expected_volume
    total = sum(i.expected_hits for i in plan.fresh)
    total += sum(i.expected_hits for i in plan.items if id(i) in keep)
    for i in plan.items:
        if total >= need - _EPS:
            break
        if id(i) not in keep:
            keep.add(id(i))
            total += i.expected_hits
    why = f"left out: the plan reaches the {bar:.0%} hit bar without it"
    plan.skipped += [Skipped(i.tenant, i.query, why) for i in plan.items if id(i) not in keep]
    plan.items = [i for i in plan.items if id(i) in keep]
