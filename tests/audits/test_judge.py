"""The monitor's judgement as budget evidence: an audited hit's verdict counts in the audited
stratum (sampled at the monitor's share, weighed apart from shadow checks), at its strength."""

from __future__ import annotations

import numpy as np

from audits.judge import Auditor, ServedHit
from caches.keys import Namespace
from caches.matching.answers import AnswerJudge
from caches.matching.bounds import Strata
from caches.matching.error_budget import ErrorBudget, MemoryCounts


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def _hit(strength: int | None, answer: np.ndarray) -> ServedHit:
    ns = Namespace("t", "m", "v1", "t1")
    return ServedHit(ns, "faq", "c", "p", "q", answer, "e", 0.8, "verified:L1:x:s1", strength,
                     "the cached answer", answer)  # fmt: skip


def test_auditor__counts_a_verdict_as_an_audit_at_the_hit_s_strength():
    budget = ErrorBudget(MemoryCounts(), levels=3, max_wrong_rate=0.01)
    auditor = Auditor(AnswerJudge(), budget)
    x, y = _unit([1, 0, 0]), _unit([0, 1, 0])
    auditor.audit(_hit(1, x), "another answer", y, 0.0)  # the re-ask disagrees: wrong
    auditor.audit(_hit(1, x), "the cached answer", x, 0.0)
    auditor.audit(_hit(None, x), "another answer", y, 0.0)  # no ladder strength: no evidence
    assert budget.counts.read_strata("t", "faq", 3) == [Strata(), Strata(0, 0, 2, 1), Strata()]
