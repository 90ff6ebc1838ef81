"""The sample `analyze` embeds past its budget, and its estimates (no embedder needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from audits.whatif.cache_replay import EXACT, SEMANTIC, simulate
from audits.whatif.keyed_log import KeyedLog, key_frame
from audits.whatif.sample import FAMILY_CAP, draw, families
from simulation.logs.longtail import LongTailSpec, generate

DAY = 86_400


def _log(rows: int = 20_000) -> pd.DataFrame:
    return generate(LongTailSpec(rows=rows, seed=3))


def test_sample__under_the_budget_is_the_whole_log() -> None:
    log = key_frame(_log(2_000))
    s = draw(log, budget=None)
    assert s.log is log and s.rate == 1.0 and bool((s.weight == 1).all())
    assert s.facts["sampled"] is False
    assert draw(log, budget=10**6).log is log


def test_sample__families_join_prompts_a_few_trimmed_words_apart() -> None:
    fam = families(
        [
            "what is my balance",  # 0
            "hey what is my balance please",  # 1: trimmed 1 + 1 -> 0
            "What is my balance?",  # 2: case and punctuation do not count
            "can you tell me what is my balance",  # 3: 4 words trimmed from the front
            "so can you tell me what is my balance",  # 4: 5 from the front, but 1 -> 3
            "what is my balance, also how do i set a timer for ten minutes",  # 5: 9 trimmed
            "what is the balance",  # 6: another word inside: another family
            "my balance",  # 7: 2 words trimmed from the front of 0
        ]
    )
    assert len({fam[i] for i in (0, 1, 2, 3, 4, 7)}) == 1
    assert fam[5] != fam[0] and fam[6] != fam[0]


def test_sample__a_family_never_grows_past_its_cap() -> None:
    # "a", "a a", "a a a", ...: each is the next one trimmed by a word, a chain through all
    fam = families([" ".join(["a"] * n) for n in range(1, 3 * FAMILY_CAP)])
    assert np.bincount(fam).max() <= FAMILY_CAP


def _prompts(log: KeyedLog) -> pd.Series:
    return pd.Series(
        [log.key_prompt[k] if k >= 0 else None for k in log.key.tolist()], dtype=object
    )


def test_sample__families_whole_most_asked_certain_bypass_always() -> None:
    log = key_frame(_log())
    s = draw(log, budget=2_000)
    assert s.facts["sampled"] and s.facts["embedded_prompts"] < s.facts["distinct_prompts"]
    asked, kept = _prompts(log).value_counts(), _prompts(s.log).value_counts()
    # every prompt is kept with all of its requests, or not at all
    assert (kept == asked[kept.index]).all()
    # ... and so is every family: its prompts are all kept, or none is
    fam = pd.Series(families(list(asked.index)), index=asked.index)
    taken = fam.index.isin(kept.index)
    by_family = pd.Series(taken).groupby(fam.to_numpy()).nunique()
    assert (by_family == 1).all()
    # the most asked family is certain: its requests count once each
    top = fam.index[fam == fam[asked.index[0]]]
    rows = _prompts(s.log).isin(top).to_numpy()
    assert rows.any() and bool((s.weight[rows] == 1.0).all())
    # the rest count 1 / rate each (a family's requests alike); bypassed requests are all kept
    assert set(np.round(s.weight, 6).tolist()) == {1.0, round(1 / s.rate, 6)}
    assert int((s.log.key < 0).sum()) == int((log.key < 0).sum())
    assert s.requests[None] == log.requests


def _same_intent(log: KeyedLog) -> list[list[int]]:
    """Semantic neighbours for the estimator's test: keys whose first request has the same label
    in the same must-filter group (the simulation needs lists, not how they were found)."""
    assert log.label is not None
    first = np.full(len(log.key_prompt), -1)
    cacheable = np.flatnonzero(log.key >= 0)
    first[log.key[cacheable][::-1]] = log.label[cacheable][::-1]
    groups: dict[tuple[int, int], list[int]] = {}
    for k, (g, lab) in enumerate(zip(log.key_group.tolist(), first.tolist(), strict=True)):
        groups.setdefault((g, lab), []).append(k)
    return [[j for j in groups[g, lab] if j != k] for k, (g, lab) in
            enumerate(zip(log.key_group.tolist(), first.tolist(), strict=True))]  # fmt: skip


def test_sample__semantic_estimate_corrects_for_servers_left_out() -> None:
    # Paraphrases in other words serve one another (same intent), so a sample that leaves out
    # a server misses the hit: the uncorrected rate leans low, the full correction high (here
    # every phrasing of an intent serves every other, many servers per hit), and the interval
    # between them holds the truth. Where the midpoint lands depends on how many servers a hit
    # has; bench_analyze_1m.py measures it on MiniLM's neighbours.
    frame = _log()
    # the one-offs ("oos") are no paraphrases of one another: a label each
    frame["topic"] = frame["intent"].where(frame["intent"] != "oos", frame.index.astype(str))
    log = key_frame(frame, labels="topic")
    truth_run = simulate(log, _same_intent(log), DAY)
    truth = float(((truth_run.outcome == EXACT) | (truth_run.outcome == SEMANTIC)).mean())
    plain_err, full_err, inside = [], [], 0
    for seed in range(8):
        s = draw(log, budget=3_000, seed=seed)
        run = simulate(s.log, _same_intent(s.log), DAY)
        hit = (run.outcome == EXACT) | (run.outcome == SEMANTIC)
        unseen = s.unseen(run.served_by)
        n = s.requests[None]
        plain_err.append(s.total(hit, None) / n - truth)
        full_err.append(s.total(hit + unseen, None) / n - truth)
        lo, hi = s.interval(hit, None, n, unseen)
        inside += lo <= truth <= hi
    assert max(plain_err) < 0 < min(full_err)  # the bias, and the bound on it
    assert inside == 8


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
