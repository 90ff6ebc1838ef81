"""Cold start: what the verified matcher serves before neighbours and verdicts can vouch.

The ladder (verified.py) serves a look-alike where other cached answers near the query agree
with the candidate's, at the loosest level the error budget has evidence for. A young cache has
neither: few neighbours and no verdicts, so it serves the strictest level, which wants three
agreeing neighbours and rarely finds them.

The cold rule serves on the prompts, strictly (`ColdRule.pick`):
- the candidate's prompt cosine to the query clears `score`;
- no lexical guard fires (number, negation, order: what a sentence embedding cannot see);
- no other point near the query was answered otherwise within `margin` of the candidate's
  score. Answers only veto here, never vouch: a backend whose answers tell nothing apart costs
  the rule hits, never adds a wrong one.

When it may serve (budget.cold_open, from the budget's counts; the cold rule's verdicts are a
stratum of their own, one slot past the ladder's, see error_budget.py):
1. on trial, on its calibration alone: while the route holds fewer verdicts in all than any
   level needs to be shown within budget (`min_evidence`: 299 at 1%), and none of the cold
   rule's own came back wrong;
2. after that, only while its own verdicts show it within budget, as a ladder level must;
3. its verdicts are the monitor's audits of its hits and, while it is closed, the shadow checks
   of the misses it would have served (their live answer against the candidate's), so a closed
   rule can earn its way back.
So a route moves to the ladder as verdicts come in. Nothing here reads a label.

Calibration (the trial serves on it; labels score these figures, the rule never reads one):
chosen on CLINC150 val + oos_val (evals/tune.py), the prompt half alone (cosine and guards, no
answer consulted, never closed): the lowest score at which it served no wrong hit over the
stream's first 500 queries, a young cache. On val that is 0.88 (30 hits of 500, none wrong;
0.86 served one wrong). Over a full cache, dense with near intents, it can go over the 1%
budget, which is why it serves on trial only. Its figures on test are in docs/benchmarks.md,
"Semantic quality" (semantic_quality_clinc_cold_first500). The margin is not tuned: the answer
veto moved none of these figures on the simulator (the wrong look-alikes had no rival near),
and it can only lower them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from caches.matching.base import Candidate, Query
from caches.matching.lexical import first_violation


@dataclass(frozen=True)
class ColdRule:
    score: float = 0.88  # the candidate's prompt cosine to the query, at least
    margin: float = 0.05  # over the nearest point answered otherwise, at least

    def __str__(self) -> str:
        return f"cos>={self.score:.2f},guards,margin>={self.margin:.2f}"

    def pick(self, q: Query, cands: Sequence[Candidate], bar: float) -> int:
        """The first entry among `cands` (best score first) the rule serves, else -1."""
        for i, c in enumerate(cands):
            if c.score < self.score:
                return -1
            if c.kind != "entry" or c.answer is None:
                continue  # no answer to check the others against: not clearly safe
            if first_violation(q.prompt, c.prompt) is not None:
                continue
            rival = max(
                (
                    n.score
                    for j, n in enumerate(cands)
                    if j != i and n.answer is not None and float(n.answer @ c.answer) < bar
                ),
                default=0.0,
            )
            if c.score - rival >= self.margin:
                return i
        return -1


DEFAULT_COLD = ColdRule()
