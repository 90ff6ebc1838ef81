"""A matcher that serves a look-alike only where the backend's own answers vouch for it.

The store keeps, beside each prompt vector, the vector of what the backend answered (an entry:
the cached answer; a probe: a monitor's re-ask). One search at the neighbour floor returns the
query's nearest points of both kinds with their answer vectors. A candidate entry is served
when:
- its prompt cosine to the query clears the level's `score`;
- at least `agree` of the query's other neighbours (prompt cosine >= `neighbour_floor`, the
  candidate itself excluded) got an answer that agrees with the candidate's (answer cosine
  >= the judge's bar): the backend answered the query's neighbourhood the way the entry says;
- the candidate is nearer the query, by at least the level's `margin`, than any neighbour whose
  answer differs (answer cosine < the bar): where the backend said something else about as
  near, the query may be that something else. A margin, not a veto: a differing answer far
  off does not block a candidate that is much nearer (a nearest-other-answer ratio test);
- the two prompts name the same numbers (the number guard): "a 2 minute timer" is not served
  "a 1 minute timer"'s answer, however alike the answers to the two read otherwise.
Nothing here reads a label: prompts, vectors and what the backend answered.

A young cache has no neighbours to vouch: the cold rule (cold.py) serves its clearly safe
look-alikes on trial until verdicts come in.

All of this rests on the backend's answers telling meanings apart, which the matcher checks
on the backend's own traffic (calibration.py). Until they are shown to, and for as long as
they are shown not to, it serves the prompt-only rule (fallback.py) instead, and its rules and
reasons say so ("verified:fallback:<state>:...").

Levels form a ladder, loosest first; each accepts a subset of what the one before accepts
(score, agree and margin never fall along it), so a hit's `strength` (the strictest level it
passes) says which levels would have served it. The error budget (caches/matching/error_budget.py)
moves the serving level along the ladder from the monitor's verdicts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from caches.matching.answers import ANSWER_GUARDS, DEFAULT_ANSWER_BAR
from caches.matching.base import Accepted, Candidate, Matcher, Query, Vector, best_score
from caches.matching.calibration import NEAR, AnswerChecks, AnswerSignal
from caches.matching.cold import ColdRule
from caches.matching.fallback import PromptRule
from caches.matching.lexical import first_violation


@dataclass(frozen=True)
class Level:
    score: float  # the candidate's prompt cosine to the query, at least
    agree: int  # neighbours whose answers agree with the candidate's, at least
    margin: float = 0.0  # over the nearest neighbour whose answer differs, at least

    def __str__(self) -> str:
        return f"cos>={self.score:.2f},agree>={self.agree},margin>={self.margin:.2f}"


# Loosest first, chosen on CLINC150 val + oos_val (evals/tune.py, benchmarks/tune_semantic.py:
# each level of a grid held fixed for a whole eval-semantic run with simulated answers; per
# wrong-share target, 1% down to none, the level with the most hits that does not loosen the
# one before), never on test, which the benchmarks report; the last is what a route with no
# verdicts yet serves. The margin does most of the work (each level's figures on test are in
# docs/benchmarks.md, "Semantic quality").
LADDER: tuple[Level, ...] = (
    Level(0.66, 1, 0.10),
    Level(0.66, 1, 0.15),
    Level(0.66, 2, 0.15),
    Level(0.66, 2, 0.25),
    Level(0.66, 2, 0.30),
    Level(0.70, 2, 0.30),
    Level(0.88, 2, 0.30),
    Level(0.88, 3, 0.30),
)


# A miss's reason while the answer checks have nothing to go on (calibration.py: "unknown").
NO_EVIDENCE_YET = (
    "no_evidence_yet: the cache has not yet seen enough answers to tell whether look-alikes "
    "mean the same"
)


@dataclass(frozen=True)
class Shadowed:
    """A miss's candidate to check the live answer against: at `strength` (a ladder level, or
    the cold slot), against `reference`, the centroid of `members` answers."""

    index: int
    strength: int  # -1: no budget verdict, only the answer checks
    reference: Vector
    members: int
    # The answers of points at prompt cosine >= NEAR with no guard firing: the live answer
    # should agree with each (calibration.py's near check).
    near: tuple[Vector, ...] = ()


@dataclass(frozen=True)
class Assessment:
    """The best entry candidate, the strictest level it passes (-1: none), and what the
    backend is taken to mean there: the centroid of the candidate's answer and of the (up to
    two) neighbours' answers that agreed with it most (`members` of them), the reference a
    live or re-asked answer is judged against (AnswerJudge.agree)."""

    index: int
    strength: int
    agree: int
    neighbours: int
    reference: Vector | None = None
    members: int = 0
    margin: float = 0.0  # the candidate's score over the nearest neighbour answered otherwise


def check_ladder(ladder: Sequence[Level]) -> None:
    if not ladder:
        raise ValueError("a ladder needs at least one level")
    for a, b in itertools.pairwise(ladder):
        if b.score < a.score or b.agree < a.agree or b.margin < a.margin:
            raise ValueError(f"ladder levels must not loosen: {a} then {b}")


class VerifiedMatcher(Matcher):
    """Serve at the level `level_of(q)` names (an index into `ladder`)."""

    name = "verified"
    needs_answers = True

    def __init__(
        self,
        level_of: Callable[[Query], int],
        *,
        ladder: Sequence[Level] = LADDER,
        bar: float = DEFAULT_ANSWER_BAR,
        neighbour_floor: float = 0.55,
        neighbours: int = 8,
        cold: ColdRule | None = None,
        cold_open: Callable[[Query], bool] = lambda q: False,
        fallback: PromptRule | None = None,
        signal_of: Callable[[Query], AnswerSignal | None] = lambda q: None,
        checks: AnswerChecks | None = None,
    ) -> None:
        """`cold`, `cold_open`: the cold-start rule (cold.py) and whether a query's route may
        be served by it now (ServingLevels.cold_open); None: the ladder alone. `fallback`,
        `signal_of`: the prompt-only rule (fallback.py) and the route's answer checks
        (calibration.py); the fallback serves instead of the ladder and the cold rule while
        the answers are not shown to separate (None: the checks were never read, so the
        ladder serves as configured)."""
        super().__init__()
        self.fallback = fallback
        self.signal_of = signal_of
        self.needs_vectors = fallback is not None and fallback.needs_vectors
        check_ladder(ladder)
        self.ladder = tuple(ladder)
        self.level_of = level_of
        self.cold = cold
        self.cold_open = cold_open
        self.cold_slot = len(self.ladder)  # the cold rule's verdicts' strength (error_budget.py)
        self.bar = bar
        self.neighbour_floor = neighbour_floor
        self.neighbours = neighbours
        self.limit = neighbours + 2  # the candidates are among them

    def floor_for(self, q: Query) -> float:
        return min(self.neighbour_floor, self.ladder[0].score)

    def assess(self, q: Query, cands: Sequence[Candidate]) -> Assessment:
        """The strongest entry among `cands` (all kinds, best score first)."""
        best = Assessment(-1, -1, 0, 0)
        for i, c in enumerate(cands):
            if c.kind != "entry" or c.answer is None or c.score < self.ladder[0].score:
                continue
            if first_violation(q.prompt, c.prompt, ANSWER_GUARDS) is not None:
                continue  # another amount or date: its answer carries it (phrasing, monitor)
            others = [
                n
                for j, n in enumerate(cands)
                if j != i and n.answer is not None and n.score >= self.neighbour_floor
            ][: self.neighbours]
            near = [n.answer for n in others if n.answer is not None]
            near_scores = [n.score for n in others]
            agreement = np.array([float(a @ c.answer) for a in near])
            agree = int((agreement >= self.bar).sum())
            differs = [s for s, ag in zip(near_scores, agreement, strict=True) if ag < self.bar]
            margin = c.score - max(differs, default=0.0)
            strength = self._strength(c.score, agree, margin)
            if strength > best.strength:
                ref, members = _centroid(c.answer, near, agreement, self.bar)
                best = Assessment(i, strength, agree, len(near), ref, members, margin)
        return best

    def _strength(self, score: float, agree: int, margin: float) -> int:
        s = -1
        for k, lvl in enumerate(self.ladder):
            if score >= lvl.score and agree >= lvl.agree and margin >= lvl.margin:
                s = k
        return s

    def falling_back(self, q: Query) -> AnswerSignal | None:
        """The route's answer checks when they put it on the prompt-only rule, else None."""
        if self.fallback is None:
            return None
        sig = self.signal_of(q)
        return sig if sig is not None and sig.state != "separates" else None

    def choose(self, q: Query, cands: Sequence[Candidate]) -> Accepted | None:
        """The prompt-only rule while the answers cannot vouch; else the ladder at the serving
        level, then the cold rule, while its route's is open."""
        sig = self.falling_back(q)
        if sig is not None:
            assert self.fallback is not None
            i = self.fallback.pick(q, cands)
            self.stats.verified("fallback" if i >= 0 else "fallback_none")
            if i < 0:
                return None
            return Accepted(i, f"verified:fallback:{sig.state}:{self.fallback}")
        a = self.assess(q, cands)
        level = self._level(q)
        if a.index >= 0 and a.strength >= level:
            self.stats.verified("agree")
            return Accepted(a.index, f"verified:L{level}:{self.ladder[level]}:s{a.strength}")
        if self.cold is not None and self.cold_open(q):
            i = self.cold.pick(q, cands, self.bar)
            if i >= 0:
                self.stats.verified("cold")
                return Accepted(i, f"verified:cold:{self.cold}:s{self.cold_slot}")
        self.stats.verified("unsure" if a.index < 0 else "below_level")
        return None

    def _level(self, q: Query) -> int:
        return min(max(self.level_of(q), 0), len(self.ladder) - 1)

    def why_not(self, q: Query, cands: Sequence[Candidate]) -> str:
        sig = self.falling_back(q)
        if sig is not None:
            guard = self._guarded(q, cands)
            why = f"the prompts differ ({guard})" if guard else sig.describe()
            return f"{best_score(cands)}; prompt-only fallback ({self.fallback}) found none: {why}"
        a = self.assess(q, cands)
        level = self._level(q)
        got = "no candidate vouched" if a.index < 0 else f"best vouched to L{a.strength}"
        cold = ""
        if self.cold is not None:
            cold = "; cold rule " + ("open" if self.cold_open(q) else "closed")
        return f"{best_score(cands)}; verified serves L{level} ({self.ladder[level]}), {got}{cold}"

    def miss_reason(self, q: Query, cands: Sequence[Candidate]) -> str:
        """no_evidence_yet while the answer checks have shown nothing either way and no guard
        told the nearest look-alike apart: the miss is the young cache's caution, not a verdict
        on the look-alike (a person reads this in X-Stoker-Reason)."""
        sig = self.falling_back(q)
        if sig is None or sig.state != "unknown" or self._guarded(q, cands):
            return super().miss_reason(q, cands)
        return (
            f"{NO_EVIDENCE_YET}; until it has, it serves only prompts at {self.fallback} "
            f"({best_score(cands)})"
        )

    def _guarded(self, q: Query, cands: Sequence[Candidate]) -> str | None:
        """The guard that told the fallback's best-scoring entry apart from the query, if one
        did (an entry the rule would otherwise have served)."""
        assert self.fallback is not None
        for c in cands:
            if c.kind == "entry" and c.score >= self.fallback.score:
                guard = first_violation(q.prompt, c.prompt)
                if guard is not None:
                    return guard
        return None

    def shadow_of(self, q: Query, cands: Sequence[Candidate]) -> Shadowed | None:
        """What a miss's live answer is judged against, as budget evidence: the ladder's best
        candidate (its strength, its reference); else, when there is none, the entry the cold
        rule would have served (its own answer, the cold slot): a closed cold rule earns its
        way back from these. None: nothing to check."""
        near = self.near_answers(q, cands)
        a = self.assess(q, cands)
        if a.index >= 0 and a.reference is not None:
            return Shadowed(a.index, a.strength, a.reference, a.members, near)
        i = -1 if self.cold is None else self.cold.pick(q, cands, self.bar)
        answer = cands[i].answer if i >= 0 else None
        if answer is not None:
            return Shadowed(i, self.cold_slot, answer, 1, near)
        if near:  # no verdict for the budget, only the near check
            return Shadowed(-1, -1, near[0], 1, near)
        return None

    def near_answers(self, q: Query, cands: Sequence[Candidate]) -> tuple[Vector, ...]:
        """Answers of points (entries and probes) at prompt cosine >= NEAR to the query whose
        prompts no guard tells apart from it: the live answer should agree with them."""
        return tuple(
            c.answer
            for c in cands
            if c.answer is not None
            and c.score >= NEAR
            and first_violation(q.prompt, c.prompt) is None
        )


def _centroid(
    answer: Vector, near: list[Vector], agreement: npt.NDArray[np.float64], bar: float
) -> tuple[Vector, int]:
    top = [near[k] for k in np.argsort(-agreement)[:2] if agreement[k] >= bar]
    c = np.sum([answer, *top], axis=0)
    return (c / np.linalg.norm(c)).astype(np.float32), 1 + len(top)


def strength_of(rule: str) -> int | None:
    """The strength a verified hit's rule records ("verified:L2:...:s4" -> 4; a cold hit's is
    the cold slot, len(LADDER)), else None (a prompt-only fallback hit is no ladder evidence)."""
    if not rule.startswith(("verified:", "conservative:verified:")) or ":fallback:" in rule:
        return None
    return int(rule.rsplit(":s", 1)[1])
