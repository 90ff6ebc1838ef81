"""The error budget: the Clopper-Pearson bound, and a serving level that loosens only on evidence
and tightens when verdicts go wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from caches.matching.bounds import Shares, Strata
from caches.matching.error_budget import ErrorBudget, MemoryCounts, shown_within, upper_bound


@pytest.mark.parametrize(
    ("wrong", "checked", "expected"),
    [
        (0, 299, 0.00997),  # the rule of three: 3/n
        (1, 100, 0.0466),
        (5, 1000, 0.0105),
        (0, 0, 1.0),
        (3, 3, 1.0),
    ],
)
def test_upper_bound__matches_the_exact_binomial_bound(wrong, checked, expected):
    assert upper_bound(wrong, checked) == pytest.approx(expected, abs=2e-4)


def _budget(levels: int = 3) -> ErrorBudget:
    return ErrorBudget(MemoryCounts(), levels=levels, max_wrong_rate=0.01)


def test_budget__starts_strict_and_loosens_only_as_far_as_evidence_reaches():
    b = _budget()
    assert b.level("acme", "faq") == 2  # no evidence: the strictest level
    for _ in range(400):
        b.record("acme", "faq", 1, wrong=False)  # pairs that level 1 (and 0) would serve
    assert b.level("acme", "faq") == 0  # level 0 has the same 400 clean pairs
    for _ in range(3):
        b.record("acme", "faq", 0, wrong=True)  # what only level 0 served went wrong
    assert b.level("acme", "faq") == 1
    assert b.level("acme", "chat") == 2  # per route
    assert b.level("globex", "faq") == 2  # and per tenant


def test_budget__tightens_when_the_strict_pairs_go_wrong_too():
    b = _budget()
    for _ in range(400):
        b.record("acme", "", 2, wrong=False)
    assert b.level("acme", "") == 0
    for _ in range(8):
        b.record("acme", "", 2, wrong=True)
    bounds = b.bounds("acme", "")
    assert all(x.bound > 0.01 for x in bounds)
    assert b.level("acme", "") == 2


def test_budget__refuses_a_rate_that_is_no_rate():
    with pytest.raises(ValueError, match="wrong-hit rate"):
        ErrorBudget(MemoryCounts(), levels=2, max_wrong_rate=0)


@given(
    checked=st.integers(0, 3000),
    wrong=st.integers(0, 60),
    delta=st.sampled_from([0.001, 0.005, 0.01, 0.02, 0.05, 0.2, 0.5]),
)
def test_shown_within__says_what_the_bound_says_without_bisecting(checked, wrong, delta):
    assert shown_within(wrong, checked, delta) == (upper_bound(wrong, checked) <= delta)


def test_memory_counts__a_copy_counts_on_alone():
    base = MemoryCounts()
    base.add("t", "r", 2, wrong=True)
    assert base.add_once("t", "r", 1, wrong=False, once="ev1")
    c = base.copy()
    assert c.read("t", "r", 3) == base.read("t", "r", 3) == [(0, 0), (1, 0), (1, 1)]
    assert c.read_strata("t", "r", 3)[1:] == [Strata(0, 0, 1, 0), Strata(1, 1, 0, 0)]
    c.add("t", "r", 2, wrong=False)
    assert not c.add_once("t", "r", 1, wrong=False, once="ev1")  # the marks come along
    assert c.read("t", "r", 3)[2] == (2, 1) and base.read("t", "r", 3)[2] == (1, 1)


def _sampled(shadow_wrong: int) -> ErrorBudget:
    """A route served at level 2 of 3: 400 audits of its hits (strength 2, a fifth of 2,000
    served, all clean), 300 shadow checks of its near misses at strength 1 (every one
    checked), `shadow_wrong` of them wrong, and 100 at strength 0, 20 wrong (level 0 is bad
    whatever the weights); the production shares."""
    b = ErrorBudget(
        MemoryCounts(), levels=3, max_wrong_rate=0.01, shares=Shares(audited=0.2, shadow=1.0)
    )
    for _ in range(400):
        b.record("acme", "", 2, wrong=False, audited=True)
    for i in range(300):
        b.record("acme", "", 1, wrong=i < shadow_wrong)
    for i in range(100):
        b.record("acme", "", 0, wrong=i < 20)
    return b


def test_budget__weighs_oversampled_near_misses_down_and_loosens():
    # Level 1 would serve the 2,000 hits and the 300 near misses: 3 wrong in 2,300 (0.13%).
    # Counted alike, 3 wrong in 700 verdicts bound it at 1.10%, and level 2 served on.
    b = _sampled(3)
    alike = ErrorBudget(b.counts, levels=3, max_wrong_rate=0.01)
    assert alike.bounds("acme", "")[1].bound > 0.01
    assert alike.level("acme", "") == 2
    level1 = b.bounds("acme", "")[1]
    assert (level1.checked, level1.wrong) == pytest.approx((460.0, 0.6))
    assert level1.bound < 0.01
    assert b.level("acme", "") == 1


def test_budget__does_not_loosen_when_the_near_misses_are_bad():
    # 40 wrong of 300 near misses: level 1's pairs are 40 wrong in 2,300 (1.7%), however
    # clean the served ones
    b = _sampled(40)
    assert b.bounds("acme", "")[1].bound > 0.01
    assert b.level("acme", "") == 2


def test_budget__keeps_the_cold_and_check_slots_unweighted():
    b = ErrorBudget(MemoryCounts(), levels=2, max_wrong_rate=0.01, shares=Shares(0.2, 1.0))
    b.record("acme", "", b.cold, wrong=False, audited=True)
    b.record("acme", "", b.cold, wrong=True)
    ev = b.evidence("acme", "")
    assert (ev.cold.checked, ev.cold.wrong) == (2, 1)
