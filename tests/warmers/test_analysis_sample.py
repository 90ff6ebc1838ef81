"""The sample `analyze` embeds past its budget, and its estimates (no embedder needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from warmers.analysis.keyed_log import key_frame
from warmers.analysis.sample import draw
from warmers.analysis.simulation import EXACT, simulate
from warmers.longtail_log import LongTailSpec, generate

DAY = 86_400


def _log(rows: int = 20_000) -> pd.DataFrame:
    return generate(LongTailSpec(rows=rows, seed=3))


def test_sample__under_the_budget_is_the_whole_log() -> None:
    log = key_frame(_log(2_000))
    s = draw(log, budget=None)
    assert s.log is log and s.rate == 1.0 and bool((s.weight == 1).all())
    assert s.facts["sampled"] is False
    assert draw(log, budget=10**6).log is log


def test_sample__head_whole_tail_whole_or_not_bypass_always() -> None:
    log = key_frame(_log())
    s = draw(log, budget=2_000)
    assert s.facts["sampled"] and s.facts["embedded_prompts"] < s.facts["distinct_prompts"]
    full_prompts = pd.Series(
        [log.key_prompt[k] if k >= 0 else None for k in log.key.tolist()], dtype=object
    )
    kept_prompts = pd.Series(
        [s.log.key_prompt[k] if k >= 0 else None for k in s.log.key.tolist()], dtype=object
    )
    asked = full_prompts.value_counts()
    kept = kept_prompts.value_counts()
    # every prompt is kept with all of its requests, or not at all
    assert (kept == asked[kept.index]).all()
    # the 1,000 most asked are all there, each request counting once
    head = set(asked.index[: s.facts["head_prompts"] // 2])
    assert head <= set(kept.index)
    assert bool((s.weight[kept_prompts.isin(head).to_numpy()] == 1.0).all())
    # the rest count 1 / rate each (a prompt's requests alike); bypassed requests are all kept
    assert set(np.round(s.weight, 6).tolist()) == {1.0, round(1 / s.rate, 6)}
    weights = pd.Series(s.weight).groupby(kept_prompts.to_numpy()).nunique()
    assert (weights == 1).all()
    assert int((s.log.key < 0).sum()) == int((log.key < 0).sum())
    assert s.requests[None] == log.requests


def test_sample__exact_hit_rate_estimate_lies_within_its_interval_of_the_truth() -> None:
    # Exact hits of a key depend only on its own requests: the estimate is unbiased, and over
    # seeds the truth falls inside the 95% interval about 95% of the time.
    log = key_frame(_log())
    truth = float((simulate(log, None, DAY).outcome == EXACT).mean())
    inside = 0
    for seed in range(20):
        s = draw(log, budget=1_500, seed=seed)
        hit = simulate(s.log, None, DAY).outcome == EXACT
        lo, hi = s.interval(hit, None, s.requests[None])
        assert hi - lo < 0.05  # informative, not a blanket
        inside += lo <= truth <= hi
    assert inside >= 16
