"""The answer checks (is the backend's answer agreement worth anything?) and the prompt-only
fallback the verified matcher serves when it is not."""

from __future__ import annotations

import numpy as np
import pytest

from caches.matching.base import Candidate, Query
from caches.matching.calibration import (
    AnswerChecks,
    AnswerSignal,
    RecentAnswers,
    band,
    signal_of,
)
from caches.matching.error_budget import ErrorBudget, LevelBound, MemoryCounts, ServingLevels
from caches.matching.fallback import PromptRule
from caches.matching.verified import Level, VerifiedMatcher, strength_of


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def _signal(near: tuple[int, int], unrelated: tuple[int, int]) -> AnswerSignal:
    return AnswerSignal(LevelBound(0, *near), LevelBound(1, *unrelated))


@pytest.mark.parametrize(
    ("near", "unrelated", "state"),
    [
        ((0, 0), (0, 0), "unknown"),  # nothing seen
        ((60, 0), (60, 0), "separates"),  # both rates shown under 10% (bound 4.9% each)
        ((20, 0), (300, 3), "unknown"),  # 20 clean near pairs bound 13.9%: not yet shown
        ((40, 12), (300, 3), "blind"),  # near pairs disagree 30%, shown over 10%
        ((60, 0), (100, 25), "blind"),  # unrelated answers agree 25%: the judge vouches blindly
        ((40, 6), (300, 3), "unknown"),  # 15% disagree: neither shown over nor under 10%
    ],
)
def test_answer_signal__separates_only_when_both_rates_are_shown_low(near, unrelated, state):
    assert _signal(near, unrelated).state == state


def test_answer_signal__describes_what_it_counted():
    text = _signal((40, 12), (300, 3)).describe()
    assert text == "answers blind (near pairs disagree 30% of 40, unrelated agree 1% of 300)"


def test_band__near_unrelated_or_neither():
    assert (band(0.97), band(0.85), band(0.8), band(0.29)) == ("near", "near", None, "unrelated")


def test_answer_checks__a_live_answer_checks_its_near_lookalikes_and_an_unrelated_one():
    budget = ErrorBudget(MemoryCounts(), levels=2, max_wrong_rate=0.01)
    checks = AnswerChecks(budget, lambda a, b: float(a @ b) >= 0.5, RecentAnswers(seed=1))
    x, y = _unit([1, 0, 0]), _unit([0, 1, 0])
    # The first miss: nothing kept to compare with.
    checks.live("t", x, _unit([1, 0, 0]))
    ev = budget.evidence("t", "")
    assert (ev.near.checked, ev.unrelated.checked) == (0, 0)
    assert signal_of(ev) is not None and signal_of(None) is None
    # A miss on an unrelated prompt (cosine 0 to x) whose answer agrees with x's: one unrelated
    # pair, counted as agreeing; and one near look-alike whose answer it contradicts.
    checks.live("t", y, _unit([1, 0.2, 0]), near=[_unit([0, 0, 1])])
    ev = budget.evidence("t", "")
    assert (ev.near.checked, ev.near.wrong) == (1, 1)
    assert (ev.unrelated.checked, ev.unrelated.wrong) == (1, 1)
    # The ladder's own counts are untouched; another tenant's are its own.
    assert budget.bounds("t", "")[0].checked == 0
    assert budget.evidence("u", "").near.checked == 0
    # An audit of a near look-alike is a near check; of a farther hit, none.
    checks.audited("t", 0.96, same=True)
    checks.audited("t", 0.81, same=False)
    assert budget.evidence("t", "").near.checked == 2


def test_recent_answers__bounded_per_pair_and_in_pairs():
    kept = RecentAnswers(per_pair=2, max_pairs=2, seed=0)
    x = _unit([1, 0])
    for i in range(5):
        kept.keep("t", "", x, _unit([1, i]))
    assert len(kept._kept[("t", "")]) == 2
    kept.keep("u", "", x, x)
    kept.keep("v", "", x, x)
    assert set(kept._kept) == {("u", ""), ("v", "")}
    assert kept.unrelated_to("u", "", x) is None  # only a look-alike of x is kept there


# -- the matcher --

Q = "what is the weather like today"


def _cands(*rows: tuple[str, float, list[float] | None]) -> list[Candidate]:
    return [
        Candidate(f"k{i}", p, s, answer=None if a is None else _unit(a))
        for i, (p, s, a) in enumerate(rows)
    ]


def _matcher(sig: AnswerSignal | None) -> VerifiedMatcher:
    # A ladder that serves anything an agreeing neighbour vouches for: what a blind judge lets
    # through; the fallback must take its place.
    return VerifiedMatcher(
        lambda q: 0, ladder=(Level(0.5, 1),), fallback=PromptRule(0.90), signal_of=lambda q: sig
    )


def test_verified__blind_answers_put_it_on_the_prompt_only_rule_and_say_so():
    q = Query(Q, _unit([1, 0]), 0.92)
    lookalike = _cands(
        ("what is the weather today", 0.93, [1, 0]),
        ("how is the weather today", 0.80, [1, 0]),
    )
    far = _cands(("how is the traffic today", 0.80, [1, 0]), ("is it traffic today", 0.7, [1, 0]))
    blind = _signal((40, 12), (300, 3))
    m = _matcher(blind)
    got = m.decide(q, lookalike)
    assert got is not None and got.index == 0
    assert got.rule == "verified:fallback:blind:cos>=0.90,guards"
    assert strength_of(got.rule) is None  # a fallback hit is no ladder evidence
    # What the ladder alone would serve (two agreeing answers at 0.80) it does not.
    assert m.decide(q, far) is None
    assert m.stats.verification == {"fallback": 1, "fallback_none": 1}
    reason = m.why_not(q, far)
    assert reason.startswith("score=0.8000; prompt-only fallback (cos>=0.90,guards) found none")
    assert "answers blind (near pairs disagree 30% of 40" in reason
    # Shown to separate, the ladder serves again; never read (None), as configured.
    for sig in (_signal((60, 0), (60, 0)), None):
        assert _matcher(sig).decide(q, far) is not None


def test_verified__the_fallback_keeps_the_guards():
    q = Query("transfer $50 to savings", _unit([1, 0]), 0.92)
    cands = _cands(("transfer $500 to savings", 0.97, [1, 0]))
    assert _matcher(_signal((40, 12), (300, 3))).decide(q, cands) is None


def test_verified__a_miss_hands_its_near_answers_to_the_checks():
    q = Query(Q, _unit([1, 0]), 0.92)
    cands = _cands(
        ("what is the weather like today?", 0.99, [1, 0]),
        ("what was the weather like today", 0.96, [0, 1]),
        ("how is the weather", 0.7, [1, 0]),
    )
    m = VerifiedMatcher(lambda q: 0, ladder=(Level(0.995, 5),))
    shadow = m.shadow_of(q, cands)
    assert shadow is not None and shadow.strength == -1  # no ladder candidate: checks only
    assert len(shadow.near) == 2  # both look-alikes at >= 0.85; the one at 0.7 is no check


def test_serving_levels__read_the_checks_per_tenant_for_every_route():
    budget = ErrorBudget(MemoryCounts(), levels=2, max_wrong_rate=0.01)
    levels = ServingLevels(budget, refresh_s=0.0)
    checks = AnswerChecks(budget, lambda a, b: float(a @ b) >= 0.5)
    for _ in range(40):
        budget.record_check("t", "", near=True, counted=True)
    q = Query(Q, _unit([1, 0]), 0.92, tenant="t", route="faq")
    sig = checks.signal(levels, q)
    assert sig is not None and sig.state == "blind" and sig.rates()["false_alarm"] == 1.0


def test_auditor__an_audit_of_a_near_look_alike_is_an_answer_check():
    from audits.judge import Auditor, ServedHit
    from caches.keys import Namespace
    from caches.matching.answers import AnswerJudge

    budget = ErrorBudget(MemoryCounts(), levels=2, max_wrong_rate=0.01)
    checks = AnswerChecks(budget, lambda a, b: float(a @ b) >= 0.5)
    auditor = Auditor(AnswerJudge(), checks=checks)
    x, y = _unit([1, 0, 0]), _unit([0, 1, 0])

    def hit(score: float) -> ServedHit:
        ns = Namespace("t", "m", "v1", "t1")
        return ServedHit(ns, "r", "c", "p", "q", x, "e", score, "verified:fallback:x", None,
                         "the cached answer", x)  # fmt: skip

    auditor.audit(hit(0.93), "another answer", y, 0.0)  # near, and the re-ask disagrees
    auditor.audit(hit(0.88), "the cached answer", x, 0.0)  # near, and it agrees
    auditor.audit(hit(0.70), "another answer", y, 0.0)  # neither band: no check
    ev = budget.evidence("t", "")
    assert (ev.near.checked, ev.near.wrong) == (2, 1)
    assert ev.unrelated.checked == 0
