"""The wrong-hit monitor's judgement: a served hit, re-asked, judged by meaning.

For each sampled hit the backend is asked the query again (off-peak, at a capped QPS: the
caller's job), and the fresh answer is judged against the served one (AnswerJudge: embeddings
and lexical guards on the texts). The verdict
- is one audit record (query, served entry, score, rule, verdict);
- is evidence for the error budget, at the hit's strength, as an audit (caches/matching/error_budget.py:
  audits and shadow checks are sampled at different shares and weighed apart);
- and leaves a probe in the store: the query's vector with the fresh answer's, so the next
  lookups near it see what the backend said there (a verified matcher's neighbours).
The running tally gives the monitor's estimate of the served wrong rate, and its bound.

Used by `stoker eval-semantic` on every sampled hit, and by the monitor worker
(audits/monitor.py), which reads served hits from the request log and re-asks a live
backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from caches.keys import Namespace
from caches.matching.answers import AnswerJudge, Judgement
from caches.matching.base import Vector
from caches.matching.calibration import AnswerChecks
from caches.matching.error_budget import ErrorBudget, upper_bound
from caches.semantic.base import SemanticPoint


@dataclass(frozen=True)
class Audit:
    tenant: str
    route: str
    query: str
    entry_key: str
    score: float
    rule: str
    verdict: str
    cosine: float
    reason: str


@dataclass
class Tally:
    checked: int = 0
    wrong: int = 0

    @property
    def ratio(self) -> float:
        return self.wrong / self.checked if self.checked else 0.0

    @property
    def bound(self) -> float:
        return upper_bound(self.wrong, self.checked)


@dataclass
class Auditor:
    judge: AnswerJudge
    budget: ErrorBudget | None = None
    probe_ttl_s: float = 86_400.0
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    # The matcher's answer checks: an audit of a near look-alike (prompt cosine >= 0.85) is one
    # (caches/matching/calibration.py), whatever its rule.
    checks: AnswerChecks | None = None

    def audit(
        self,
        hit: ServedHit,
        fresh_text: str,
        fresh_vec: Vector,
        now: float,
    ) -> tuple[Audit, Judgement, SemanticPoint]:
        j = self.judge.judge(
            fresh_vec, hit.answer_vec, fresh_text, hit.answer_text, hit.answer_members
        )
        t = self.tallies.setdefault((hit.ns.tenant, hit.route), Tally())
        t.checked += 1
        t.wrong += not j.same
        if self.budget is not None and hit.strength is not None:
            self.budget.record(
                hit.ns.tenant, hit.route, hit.strength, wrong=not j.same, audited=True
            )
        if self.checks is not None:
            self.checks.audited(hit.ns.tenant, hit.score, j.same)
        audit = Audit(
            hit.ns.tenant, hit.route, hit.query, hit.entry_key, hit.score, hit.rule,
            j.verdict, round(j.cosine, 4), j.reason,
        )  # fmt: skip
        probe = SemanticPoint(
            entry_key=f"probe:{hit.entry_key}:{hit.query}",
            vector=hit.query_vec,
            ns=hit.ns,
            context_hash=hit.context_hash,
            params_hash=hit.params_hash,
            expires_at=now + self.probe_ttl_s,
            prompt=hit.query,
            answer_vector=fresh_vec,
            kind="probe",
        )
        return audit, j, probe


@dataclass(frozen=True)
class ServedHit:
    """What a served semantic hit left for the monitor to check."""

    ns: Namespace
    route: str
    context_hash: str
    params_hash: str
    query: str
    query_vec: Vector
    entry_key: str
    score: float
    rule: str
    strength: int | None
    answer_text: str  # the served answer
    answer_vec: Vector  # it, or the centroid of it and the answers that vouched for it
    answer_members: int = 1
