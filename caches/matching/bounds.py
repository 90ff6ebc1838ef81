"""The upper bound of a wrong-hit rate, from verdicts sampled at unequal rates.

A level's wrong rate is that of every pair it would serve. Its verdicts come from two samples
of those pairs (error_budget.py): the monitor audits served hits at `audited` (0.2 by default), and
near misses (a candidate short of the serving level) are shadow-checked at `shadow` (1.0).
Counted alike, a looser level's evidence over-weighs its marginal pairs (strengths between it
and the serving level: all of them near misses) by shadow/audited = 5x against the served ones
they stand beside. That bound holds only while the marginal pairs are the worse ones (on the
simulated eval-semantic stream they were: 1.1-2.4% wrong at strengths 3-5 against 0.2-0.6% at
6-7, judged and by label alike) and falls short where they are not.

So verdicts are kept per stratum (Strata: shadow, audited) and weighed by the inverse of their
sampling share (Horvitz-Thompson), rescaled so that the heaviest stratum present weighs 1:
    checked' = sum w_k n_k,  wrong' = sum w_k x_k,  w_k = (1 / share_k) / max_j (1 / share_j);
the bound is Clopper-Pearson's on (wrong', checked') (the beta quantile, which takes real
counts). Why this and not a Kish effective size ((sum w)^2 / sum w^2, larger):
- it is a valid 95% bound whatever the two strata's rates: each weighted verdict w*y (w <= 1)
  is less dispersed than a Bernoulli of the same mean (convex order), so wrong' is less
  dispersed than a binomial on checked' trials, which is what the bound assumes;
- it is the tightest that is: with every verdict clean, the data cannot tell "all strata at
  p" from "every wrong pair among the audited", and the second needs checked' = sum w_k n_k
  (weights relative to the heaviest) to be shown within a budget. Kish's size is larger and
  then covers less than it says: 120 audits and 600 shadow checks, all clean, with the true
  rate 1% all in the audited half, pass a Kish bound (0.75%) 8.9% of the time, not 5%;
  this bound (1.24%) 4.9%.
A stratum with no verdicts among a level's pairs weighs nothing, so it does not rescale the
rest: a route with no audits yet (no monitor) keeps its shadow checks at full weight, exactly
the unweighted bound. Equal shares give the unweighted counts, and then the integer path
below, bit for bit the binomial bound.

The price is evidence: a level's is worth its audits plus a fifth of its shadow checks, so a
looser level opens only once the hits it would serve have been audited a few hundred times (a
1% budget needs 299 clean; with one wrong, 473). A week of a busy route's traffic holds that;
the eval-semantic protocol's 3,100 earlier queries (~110 audits) do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

CONFIDENCE = 0.95


class Strata(NamedTuple):
    """One strength's verdicts, by how they were sampled: shadow checks of near misses (and
    verdicts counted before the strata were kept apart), and the monitor's audits of hits."""

    shadow: int = 0
    shadow_wrong: int = 0
    audited: int = 0
    audited_wrong: int = 0

    @property
    def checked(self) -> int:
        return self.shadow + self.audited

    @property
    def wrong(self) -> int:
        return self.shadow_wrong + self.audited_wrong

    def plus(self, o: Strata) -> Strata:
        return Strata(*(a + b for a, b in zip(self, o, strict=True)))


@dataclass(frozen=True)
class Shares:
    """How verdicts are sampled: the share of served hits the monitor audits
    (STOKER_MONITOR_SHARE), the share of near misses shadow-checked
    (STOKER_BUDGET_SHADOW_SHARE). A share of 0 samples nothing; should verdicts come anyway
    (another process's settings), they weigh as if sampled in full."""

    audited: float = 1.0
    shadow: float = 1.0

    def __post_init__(self) -> None:
        for name in ("audited", "shadow"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} share {getattr(self, name)} must lie in [0, 1]")

    def weigh(self, s: Strata) -> tuple[float, float]:
        """(checked', wrong'): the weighted counts of `s` (module docstring)."""
        w_a = 1.0 / self.audited if self.audited > 0 else 1.0
        w_s = 1.0 / self.shadow if self.shadow > 0 else 1.0
        top = max((w for w, n in ((w_a, s.audited), (w_s, s.shadow)) if n > 0), default=1.0)
        w_a, w_s = w_a / top, w_s / top
        if w_a == w_s:  # counted alike: whole counts (the exact binomial path)
            return float(s.checked), float(s.wrong)
        return w_s * s.shadow + w_a * s.audited, w_s * s.shadow_wrong + w_a * s.audited_wrong


def upper_bound(wrong: float, checked: float, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial rate (1.0 for no evidence); real
    counts (weighted: module docstring) through the beta distribution they generalise to."""
    if checked <= 0 or wrong >= checked:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = wrong / checked, 1.0
    for _ in range(60):  # bisection: P(X <= wrong | checked, p) falls as p grows
        mid = (lo + hi) / 2
        if _tail(wrong, checked, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def shown_within(
    wrong: float, checked: float, delta: float, confidence: float = CONFIDENCE
) -> bool:
    """upper_bound(wrong, checked) <= delta, from one CDF instead of a bisection (the bound is
    at or under delta exactly when seeing `wrong` or fewer at rate delta is that unlikely):
    what choosing a level needs, ~60x cheaper than the bound itself."""
    if checked <= 0 or wrong >= checked:
        return False
    return _tail(wrong, checked, delta) <= 1.0 - confidence


def _tail(wrong: float, checked: float, p: float) -> float:
    """P(X <= wrong) for X ~ Binomial(checked, p): the binomial sum for whole counts, else
    1 - I_p(wrong + 1, checked - wrong) (the identity that holds for whole counts)."""
    if float(wrong).is_integer() and float(checked).is_integer():
        return _binom_cdf(int(wrong), int(checked), p)
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return 1.0 - _beta_inc(wrong + 1.0, checked - wrong, p)


def _binom_cdf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0 if k < n else 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    return sum(
        math.exp(base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        for i in range(k + 1)
    )


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta I_x(a, b), a, b > 0, 0 < x < 1: its continued fraction
    (modified Lentz), on the side of the symmetry I_x(a, b) = 1 - I_(1-x)(b, a) where it
    converges fast (x under the mean (a + 1) / (a + b + 2))."""
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _beta_inc(b, a, 1.0 - x)
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        + a * math.log(x) + b * math.log1p(-x)
    )  # fmt: skip
    return math.exp(log_front) * _beta_fraction(a, b, x) / a


_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """1 / (1 + d1 / (1 + d2 / (1 + ...))), d(2m+1) = -(a+m)(a+b+m)x / ((a+2m)(a+2m+1)),
    d(2m) = m(b-m)x / ((a+2m-1)(a+2m)); to 1e-15 relative, 300 terms at most (a few dozen
    for the counts a budget holds)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    out = d
    for m in range(1, 301):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            out *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return out
