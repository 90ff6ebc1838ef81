"""The wrong-rate bound on weighted verdicts: the beta quantile on real counts, the weights of
the two strata, and coverage where the unequal sampling could fool a looser bound."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import beta

from caches.matching.bounds import Shares, Strata, shown_within, upper_bound

MONITOR = Shares(audited=0.2, shadow=1.0)  # the production defaults


@given(
    wrong=st.floats(0.0, 40.0),
    extra=st.floats(0.05, 3000.0),
)
def test_upper_bound__real_counts_give_the_beta_quantile(wrong, extra):
    checked = wrong + extra
    expected = beta.ppf(0.95, wrong + 1, checked - wrong)
    assert upper_bound(wrong, checked) == pytest.approx(expected, abs=1e-9)


@given(
    wrong=st.floats(0.0, 30.0),
    extra=st.floats(0.05, 3000.0),
    delta=st.sampled_from([0.001, 0.01, 0.02, 0.05, 0.2]),
)
def test_shown_within__says_what_the_bound_says_on_real_counts(wrong, extra, delta):
    checked = wrong + extra
    bound = upper_bound(wrong, checked)
    if abs(bound - delta) > 1e-9:  # at the edge itself the bisection's last bit decides
        assert shown_within(wrong, checked, delta) == (bound <= delta)


def test_upper_bound__whole_counts_as_floats_are_the_binomial_bound():
    assert upper_bound(3.0, 600.0) == upper_bound(3, 600)
    assert upper_bound(0.0, 299.0) == pytest.approx(0.00997, abs=2e-4)


def test_shares__weigh_each_stratum_by_its_inverse_share_the_heaviest_at_one():
    # 400 audits stand for 2,000 served hits, 300 shadow checks for 300 near misses: relative
    # to an audit a shadow check weighs 0.2
    assert MONITOR.weigh(Strata(300, 3, 400, 1)) == pytest.approx((460.0, 1.6))


def test_shares__a_stratum_with_no_verdicts_rescales_nothing():
    # no audit among these pairs (no monitor running): the shadow checks count in full
    assert MONITOR.weigh(Strata(300, 3, 0, 0)) == (300.0, 3.0)
    assert MONITOR.weigh(Strata(0, 0, 50, 1)) == (50.0, 1.0)
    assert MONITOR.weigh(Strata()) == (0.0, 0.0)


def test_shares__alike_shares_give_whole_counts():
    assert Shares().weigh(Strata(300, 3, 400, 1)) == (700.0, 4.0)
    assert Shares(0.5, 0.5).weigh(Strata(300, 3, 400, 1)) == (700.0, 4.0)


def test_shares__refuse_a_share_that_is_none():
    with pytest.raises(ValueError, match="audited share"):
        Shares(audited=1.5)


def _misses(audits: int, shadows: int, p_audited: float, p_shadow: float, runs: int) -> float:
    """How often the weighted bound falls under the true rate of the pairs both strata stand
    for (audits at 0.2, shadow checks at 1.0), over `runs` draws."""
    truth = (5 * audits * p_audited + shadows * p_shadow) / (5 * audits + shadows)
    rng = np.random.default_rng(11)
    draws = Counter(
        zip(
            rng.binomial(audits, p_audited, runs).tolist(),
            rng.binomial(shadows, p_shadow, runs).tolist(),
            strict=True,
        )
    )
    missed = 0
    for (xa, xs), n in draws.items():
        checked, wrong = MONITOR.weigh(Strata(shadows, xs, audits, xa))
        missed += n * shown_within(wrong, checked, truth)  # bound <= truth: missed
    return missed / runs


@pytest.mark.parametrize(
    ("p_audited", "p_shadow"),
    [
        (0.025, 0.0),  # every wrong pair among the served: the edge the weights are scaled for
        (0.02, 0.0),  # a true 1%: a Kish effective size (400) misses it 9% of the time
        (0.0, 0.05),  # every wrong pair among the near misses
        (0.01, 0.01),
    ],
)
def test_weighted_bound__covers_the_true_rate_at_95_percent(p_audited, p_shadow):
    # 4,000 draws: a 5% miss rate reads at most ~5.6% (3 standard errors)
    assert _misses(120, 600, p_audited, p_shadow, 4000) <= 0.056
