"""The hot set's plan: each warm send, what was left out and why, and what it should serve.

warmers/hotset/select.py makes it; `stoker warm` prints it, the shadow warmer sends its items, the
deploy pre-warm sizes it to a hit bar (warmers/prewarm.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from backends.base import GenerationRequest
from caches.request import CacheRequest
from schemas.common import DocRef, RequestParams
from schemas.errors import ConfigError
from warmers.hotset.value import Worth
from warmers.hotset.warm_budget import Budget
from warmers.hotset.window import Window

_EPS = 1e-9  # GPU-seconds a cap may be overrun by rounding


@dataclass(frozen=True)
class WarmItem:
    """A request to send and the cache identity its answer is stored under. The identity's
    prompt may differ (the user's words vs the rendered template); everything else that keys
    the answer must match, or the answer would land under someone else's key."""

    request: GenerationRequest
    identity: CacheRequest
    # What the send saves and costs (valued by the miss it prevents), to be priced again at the
    # backend's load when it is sent; None: sent whatever the load (valued by hits).
    worth: Worth | None = field(default=None, compare=False)
    # A cached entry with less than this left (seconds) is sent again: the plan valued its
    # refresh (an entry expiring inside the window); None: the warmer's own min_ttl_left_s.
    refresh_under_s: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        r, i = self.request, self.identity
        mine = (r.tenant, r.model_id, r.model_version, r.template_version, r.params, r.docs)
        theirs = (i.tenant, i.model_id, i.model_version, i.template_version, i.params, i.docs)
        if mine != theirs:
            raise ConfigError("warm item: request and cache identity differ beyond the prompt")

    @classmethod
    def of(cls, request: GenerationRequest) -> WarmItem:
        return cls(request, request.cache_request())


def logged_request(rep: Mapping[str, Any], model_version: str | None = None) -> GenerationRequest:
    """The request a logged one replays (`rep`: a RequestLogged as JSON, what the profile keeps
    as a query's representative), under `model_version` (None: its own). v2 events carry the
    upstream request, replayed as sent. KeyError, TypeError or ValueError when unreadable."""
    params = RequestParams(**(rep.get("params") or {}))
    docs = tuple(DocRef(**d) for d in rep.get("context_docs") or ())
    logged = rep.get("request") or {}
    return GenerationRequest(
        str(rep["tenant"]), str(rep["model_id"]), model_version or str(rep["model_version"]),
        str(rep["template_version"]), str(rep["prompt"]), params, docs,
        body=logged.get("body"), api=logged.get("api"), route=rep.get("route"),
        doc_generations=rep.get("doc_generations"),
    )  # fmt: skip


@dataclass(frozen=True)
class PlanItem:
    """One warm send: a cluster's representative, what it is expected to save, and why."""

    tenant: str
    model_id: str
    model_version: str
    template_version: str
    qkey: str
    query: str
    cluster_size: int
    expected_hits: float  # in the window, summed over the cluster's members
    miss_cost_ms: float  # GPU ms per miss, hit-weighted over the members
    warm_cost_ms: float  # GPU ms the representative's one warm send is expected to take
    reason: str
    item: WarmItem = field(repr=False, compare=False)
    members: tuple[str, ...] = field(default=(), repr=False)
    own_hits: float = 0.0  # the representative's own requests expected in the window
    # Valued by the miss it prevents (value.py; all None when valued by hits):
    p_asked: float | None = None  # the chance the entry is asked in the window (after expiry)
    price_send: float | None = None  # the price of a GPU-ms in the send hour, 1.0 at peak
    price_window: float | None = None  # ... in the hours it is first asked in, P-weighted
    prevented_ms: float | None = None  # Σ_k P_k x the prevented miss's value at hour k
    rates: tuple[float, ...] = field(default=(), repr=False, compare=False)  # λ per hour
    # what a miss made its caller wait, end to end, hit-weighted over the members (None: the
    # profile has no latency for it, and its GPU ms stand in; value.py)
    miss_latency_ms: float | None = None
    send_hour: int | None = None  # the span hour it is best sent in (Plan.send_at)
    # valued for the span's hours after this many hours from its start only (an entry cached,
    # or a paraphrase serving it, until then); None: all of them
    valued_from: float | None = None

    @property
    def value_ms(self) -> float:
        """Expected GPU-ms (equivalent, at peak price when priced) saved net of the warm's
        cost: under either value model; > 0 pays for its send."""
        if self.prevented_ms is not None:
            return self.prevented_ms - self.warm_cost_ms * (self.price_send or 0.0)
        return self.expected_hits * self.miss_cost_ms - self.warm_cost_ms

    def rank(self) -> tuple[bool, float]:
        """Sort key, best first: by the GPU time the warm is expected to save (the prevented
        miss's value, when priced); items serving nothing new last, most asked first. Not by
        value net of the warm's cost: past break even every value is negative, and net
        ranking would put the cheapest sends first, one-offs ahead of the most asked query."""
        if self.prevented_ms is not None and self.prevented_ms > 0:
            return False, -self.prevented_ms
        if self.prevented_ms is None and self.expected_hits > 0:
            return False, -self.expected_hits * self.miss_cost_ms
        return True, -self.own_hits * self.miss_cost_ms


@dataclass(frozen=True)
class Skipped:
    """A candidate the plan left out, and why; a rule or the budget that left out a cluster
    worth something says what it was worth."""

    tenant: str
    query: str
    reason: str
    expected_hits: float | None = None
    value_ms: float | None = None


@dataclass
class Plan:
    window: Window
    budget: Budget
    items: list[PlanItem] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)  # budget each tenant was offered
    regimes: dict[str, str] = field(default_factory=dict)  # tenant/model/template -> regime note
    # tenant -> how its forecast was scaled by the landed warms' hits (warmers/hotset/calibration.py)
    calibration: dict[str, str] = field(default_factory=dict)
    over_budget: int = 0  # clusters worth warming that the budget left out
    # Expected warmable requests in the window per tenant (the profile's forecast, the long
    # tail it tracks in aggregate only included): the denominator of a projected hit rate.
    volume: dict[str, float] = field(default_factory=dict)
    # Items already cached in the target namespace with TTL to spare (step 5): not sent, but
    # they serve their expected hits all the same.
    fresh: list[PlanItem] = field(default_factory=list)
    # Items worth warming whose cheapest send hour is later: a later run sends them.
    deferred: list[PlanItem] = field(default_factory=list)
    named: bool = False  # the budget is a person's: spent now, past break-even (select.py)
    span_start: datetime | None = None  # the first hour a send may go out in (None: window's)
    made_at: datetime | None = None  # the planner's clock when it was made

    def send_at(self, item: PlanItem) -> datetime | None:
        """The hour `item` is best sent in (valued by the miss prevented), else None (sent
        now: valued by hits, or a named budget's)."""
        if item.send_hour is None or self.named:
            return None
        return (self.span_start or self.window.start) + timedelta(hours=item.send_hour)

    @property
    def spent(self) -> float:
        return sum(self.budget.cost(i.warm_cost_ms) for i in self.items)

    @property
    def expected_gpu_s_saved(self) -> float:
        return sum(max(i.value_ms, 0.0) for i in self.items) / 1000.0

    @property
    def unused(self) -> float:
        """Budget the plan leaves unspent (requests, or GPU-seconds)."""
        return max(0.0, self.budget.total - self.spent)

    def unused_reason(self) -> str:
        """Why budget is left, in one line ("" when all of it is spent): a plan never leaves
        budget unused without saying so."""
        if self.unused <= 1e-9:
            return ""
        left = self.left_out()
        return (
            f"{self.unused:g} of {self.budget} unused: only {len(self.items)} candidates are "
            f"worth a warm send" + (f" (left out: {left})" if left else " (no other candidates)")
        )

    def left_out(self) -> str:
        """How many candidates were left out for each reason, most first, in one line ("" for
        none): "9 <reason>, 5 <reason>" (a reason's parenthesised figures dropped)."""
        why = Counter(sk.reason.split(" (")[0] for sk in self.skipped)
        return ", ".join(f"{n} {reason}" for reason, n in why.most_common())

    def warm_items(self) -> list[WarmItem]:
        """The sends, in plan order; valued by the miss prevented, each carries its worth so
        the warmer can price it again at the load the backend shows when it is sent. A named
        budget's do not: a person chose to spend it past break-even, and priced again every
        send of it was left out on a busy backend (the engine's room for live traffic still
        holds them)."""
        refresh = (
            None
            if self.made_at is None
            else max(0.0, (self.window.end - self.made_at).total_seconds())
        )
        return [
            i.item
            if i.prevented_ms is None
            else replace(
                i.item,
                worth=None if self.named else Worth(i.prevented_ms, i.warm_cost_ms),
                refresh_under_s=refresh,
            )
            for i in self.items
        ]

    @property
    def expected_volume(self) -> float:
        return sum(self.volume.values())

    def hit_share(self, items: Iterable[PlanItem]) -> float:
        """The share of the window's expected warmable requests that `items` are expected to
        serve from the cache (their expected hits, paraphrase clusters summed, over the
        volume; 0.0 when no traffic is expected). Every request of a warmed entry counts,
        the ones live traffic would have filled after a first miss too: it is the hit rate
        the warmed entries alone give the window, if the profile's forecast holds."""
        v = self.expected_volume
        return 0.0 if v <= 0 else min(1.0, sum(i.expected_hits for i in items) / v)


def cap_plan(plan: Plan, gpu_s: float, model_id: str | None = None) -> float:
    """Keep plan.items (those of `model_id`; None: all), in rank order, while their sends'
    expected GPU (warm_cost_ms) fits in `gpu_s`; an item too big for what is left is passed
    over for the smaller ones after it. Other models' items are kept as they are. What is
    left out is noted in plan.skipped. Returns the GPU-seconds kept."""
    kept, spent = [], 0.0
    for i in plan.items:
        if model_id is not None and i.model_id != model_id:
            kept.append(i)
            continue
        c = i.warm_cost_ms / 1000.0
        if spent + c <= gpu_s + _EPS:
            kept.append(i)
            spent += c
        else:
            why = f"left out: over the send hour's headroom ({gpu_s:.1f} GPU-s)"
            plan.skipped.append(Skipped(i.tenant, i.query, why, i.expected_hits, i.value_ms))
    plan.items = kept
    return spent


def sent_gpu_s(plan: Plan, sent_keys: Sequence[str], model_id: str | None = None) -> float:
    """The expected GPU-seconds (warm_cost_ms, as cap_plan counts them) of the plan's items
    (of `model_id`; None: all) that were sent."""
    sent = set(sent_keys)
    return (
        sum(
            i.warm_cost_ms
            for i in plan.items
            if (model_id is None or i.model_id == model_id)
            and i.item.identity.key().exact() in sent
        )
        / 1e3
    )
