"""The hot set's options: how the forecast weighs past days, how candidates are pooled and
clustered, and what a warm is worth. Its own module so that the forecast (which reads them)
and the selector (which runs them) import it, not each other."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from warmers.hotset.value import ValueModel
from warmers.hotset.warm_budget import DEFAULT_FLOOR

# An entry with under an hour left is warmed again: it would expire inside the window planned.
# The planner skips what outlives it and the shadow warmer re-checks it (WarmConfig).
DEFAULT_MIN_TTL_LEFT_S: Final = 3600.0
# A GPU-ms at idle as a share of one at the history's busiest hour, for the plan's value and
# the shadow warmer's price at the load the backend shows when it sends.
DEFAULT_IDLE_PRICE: Final = 0.2


class HotSetConfig(BaseModel):
    """The owner of these defaults: the warm_* settings of the planner and semantic_matcher
    point here (stoker/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bandwidth_h: float = 1.5  # queries drift by an hour or two between days, rarely more
    # 2% weight on the rest of the day: a query asked only at 09:00 still beats one never asked
    background: float = 0.02
    # ... or, with a grid, the weight that best predicts the latest matching day from the
    # others (Forecaster._background): hour patterns where the history has them, whole-day
    # shares where hours are noise. () : always `background`.
    background_grid: tuple[float, ...] = (0.02, 0.1, 0.5, 100.0)
    # A query's share at an hour is shrunk toward its share of the whole history, as by this
    # many of its own asks (Forecaster._share): with a week or two of history an hour of one
    # weekday holds a few requests per query, and a phrasing asked once near the hour is noise.
    # With a grid, chosen with the background as it is (Forecaster._smoothing). 0: none.
    # 4 on the traffic shapes and the sample log: named budgets covered 1-3 points more of a
    # window at K = 200 and 1,000 than with none (docs/benchmarks.md, "Warming as it ships").
    prior_asks: float = Field(default=4.0, ge=0.0)
    prior_grid: tuple[float, ...] = ()
    # The candidate pool is both who may represent and what is served: the query that serves
    # the most is often a central phrasing outside the most asked few (CLINC150 sample log, 50
    # warm sends: pool 200 -> 0.88 of the oracle, 2000 -> 0.90). Cost: one embedding per new
    # candidate (memoised) and a radius search over the pool.
    candidates_per_item: float = 5.0
    min_candidates: int = 2000
    # the shadow warmer's own bar: under an hour left is warmed again
    min_ttl_left_s: float = Field(default=DEFAULT_MIN_TTL_LEFT_S, ge=0)
    # None: each tenant's semantic threshold
    cluster_threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    # The semantic matcher the gateways serve with (STOKER_SEMANTIC_MATCHER). "static": one
    # warmed entry serves every paraphrase within the threshold, so a cluster of paraphrases is
    # warmed once. "verified": an entry serves a paraphrase only where other entries near it,
    # whose answers agree, vouch for it (caches/matching/verified.py); a lone representative
    # serves none, so paraphrases are not merged (unless cluster_threshold is set): each asked
    # phrasing is warmed as itself, and the hot ones vouch for each other. On the sample log's
    # bench, held at the level a week of verdicts reaches, clusters at 0.92 covered 0.21 of
    # week 2's requests at K=50, 0.77x naive top-K; unmerged, 0.27. Verified, as the gateways
    # serve by default: a planner built without settings planned for the wrong matcher.
    matcher: Literal["static", "verified"] = "verified"
    fairness_floor: float = DEFAULT_FLOOR
    # Clusters worth less than this (PlanItem.value_ms: GPU ms saved net of the warm's cost,
    # by either value model) are not warmed: by default only those that save more GPU than
    # their warm send costs. None: rank past break
    # even, so a budget of K buys K items (a latency SLO for first requests, the benchmark).
    min_value_ms: float | None = 0.0
    # The live log's last hours: a query surging now (a trend, an incident no past day saw),
    # asked at least `recent_min_count` times there at more than `recent_surge` x the share
    # the regimes forecast, is expected in the window at its recent share. Only surges: a
    # blend of every query's last hours adds noise that loses to the regimes (bench_warm_vs_naive:
    # hot_set_drift_k200_t092; docs/benchmarks.md, "On five traffic shapes"). 0 hours: off.
    # The scheduler's own rule sends what pays (the break-even) and is asked before it expires
    # with at least this chance: a send no one asks burns GPU, however cheap its hour. On the
    # sample log's week 2 (TTL 1 day) 0.6 / 0.8 / 0.9 gave sends that added a hit 68 / 82 /
    # 89% of the time at 1.04 / 1.01 / 1.00x the GPU of no warming (docs/benchmarks.md).
    min_p_send: float = Field(default=0.9, ge=0.0, le=1.0)
    # A named budget is spent on items past break-even, down to those whose chance of being
    # asked between their send and the window's end is this: under it, a send is a guess.
    # 1 in 10,000: a night window of a few requests put most candidates under 1 in 1,000, and
    # a named K = 1,000 spent 400-600 of it (docs/benchmarks.md, "Warming as it ships").
    min_p_asked: float = Field(default=0.0001, ge=0.0, le=1.0)
    # The scheduler plans the hours an entry sent now serves: its TTL, at most this many.
    horizon_h: int = Field(default=24, ge=1, le=168)
    recent_hours: int = 3
    recent_min_count: int = 3
    recent_surge: float = 3.0
    # ... or, for the queries asked too few times to surge alone, as a group: paraphrases
    # (prompt cosine at least this) asked `recent_min_count` times together; None: off. An
    # incident comes as many phrasings of one question, each asked once or twice. Measured
    # (bench_warm_vs_naive.py, one log a shape): at 0.7 the incident's surging requests were
    # covered at 0.44-0.53x the oracle against 0.40x, but the drifting load's whole window
    # fell from 1.04x naive to 0.88x at K = 50 (0.92x at 0.85): each rare phrasing asked
    # once is rarely asked again as itself, and they took the hot queries' places. Off.
    recent_paraphrase_radius: float | None = Field(default=None, gt=0.0, le=1.0)
    # A query's GPU cost per miss is its own mean shrunk toward the namespace's by this many
    # pseudo-misses (answer lengths vary request to request; a few long ones are noise).
    cost_prior_misses: float = 10.0
    # Past days count less with age (a day this old counts half); None: every day alike.
    # 14 against 7: named budgets covered about 1 point more of a window at K = 1,000 on the
    # steady shapes (longtail, quiet) and no less under drift (docs/benchmarks.md).
    history_half_life_days: float | None = 14.0
    # What a warm is worth (step 4). "prevented": the one miss it prevents, priced by load
    # (value.py), for a live cache, the scheduler's (STOKER_WARM_VALUE_MODEL); "hits": every
    # expected hit x its miss cost, what the coverage benchmarks measure and the deploy
    # pre-warm (sized to a hit bar) plans by, passing it per plan.
    value_model: ValueModel = "prevented"
    # "prevented": a GPU-ms at idle, as a share of one at peak load
    idle_price: float = Field(default=DEFAULT_IDLE_PRICE, ge=0.0, le=1.0)
    # "prevented": GPU-ms per ms of first-request latency saved
    latency_weight: float = Field(default=0.0, ge=0.0)
