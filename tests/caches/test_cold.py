"""The verified matcher's cold start: the cold rule serves a clearly safe look-alike with no
neighbour to vouch, its answers can only veto, and the budget opens it on trial and then only
on its own verdicts (unit: fixed vectors, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from caches.matching.base import Candidate, Query
from caches.matching.cold import ColdRule
from caches.matching.error_budget import ErrorBudget, MemoryCounts, cold_open, min_evidence
from caches.matching.verified import LADDER, VerifiedMatcher, strength_of

SAME, OTHER = np.eye(3, dtype=np.float32)[0], np.eye(3, dtype=np.float32)[1]
RULE = ColdRule(0.90, 0.05)


def q(prompt: str = "how do i reset my password") -> Query:
    return Query(prompt, np.zeros(3, np.float32), 0.92, tenant="acme", route="r")


def entry(prompt: str, score: float, answer: np.ndarray = SAME, kind: str = "entry") -> Candidate:
    return Candidate(prompt, prompt, score, answer=answer, kind=kind)


def test_cold_rule__serves_a_near_look_alike_nobody_vouches_for():
    assert RULE.pick(q(), [entry("how can i reset my password", 0.97)], 0.52) == 0
    assert RULE.pick(q(), [entry("how can i reset my password", 0.89)], 0.52) == -1


def test_cold_rule__a_guard_or_a_near_answer_otherwise_vetoes():
    amount = [entry("how do i reset my password in 2 steps", 0.97)]
    assert RULE.pick(q("how do i reset my password in 3 steps"), amount, 0.52) == -1
    rival = [entry("how can i reset my password", 0.95), entry("reset my pin", 0.93, OTHER)]
    assert RULE.pick(q(), rival, 0.52) == -1  # 0.02 over a different answer: not clear
    far = [entry("how can i reset my password", 0.95), entry("reset my pin", 0.80, OTHER)]
    assert RULE.pick(q(), far, 0.52) == 0
    probe = [entry("a probe", 0.99, kind="probe"), entry("how can i reset my password", 0.95)]
    assert RULE.pick(q(), probe, 0.52) == 1  # a probe is evidence, never served


def test_cold_open__on_trial_until_evidence_then_on_its_own_verdicts():
    budget = ErrorBudget(MemoryCounts(), len(LADDER), 0.01)

    def is_open() -> bool:
        return cold_open(budget.evidence("acme", "r"), budget.delta)

    assert is_open()  # no verdict at all: on trial
    for _ in range(min_evidence(0.01) - 1):
        budget.record("acme", "r", 0, wrong=False)  # the ladder's verdicts, weak and clean
    assert is_open()
    budget.record("acme", "r", 0, wrong=False)
    assert not is_open()  # enough for a level to be shown: the cold rule must show itself
    for _ in range(min_evidence(0.01)):
        budget.record("acme", "r", budget.cold, wrong=False)
    assert is_open()  # its own clean verdicts show it within budget
    assert budget.evidence("acme", "r").ladder[0].checked == min_evidence(0.01)  # apart


def test_cold_open__one_wrong_verdict_of_its_own_ends_the_trial():
    budget = ErrorBudget(MemoryCounts(), len(LADDER), 0.01)
    budget.record("acme", "r", budget.cold, wrong=True)
    assert not cold_open(budget.evidence("acme", "r"), budget.delta)


@pytest.mark.parametrize("open_", [True, False])
def test_verified__serves_by_the_cold_rule_only_while_open_and_shadow_checks_it_closed(open_):
    m = VerifiedMatcher(lambda _: len(LADDER) - 1, cold=RULE, cold_open=lambda _: open_)
    cands = [entry("how can i reset my password", 0.97)]
    got = m.decide(q(), cands)
    if open_:
        assert got is not None and got.rule == "verified:cold:cos>=0.90,guards,margin>=0.05:s8"
        assert strength_of(got.rule) == len(LADDER)  # the monitor's verdict: the cold slot
    else:
        assert got is None
        assert m.why_not(q(), cands).startswith("score=0.9700; verified serves L7")
        assert m.why_not(q(), cands).endswith("cold rule closed")
        shadow = m.shadow_of(q(), cands)  # evidence to reopen it: the would-be hit's answer
        assert shadow is not None and shadow.strength == len(LADDER) and shadow.members == 1
