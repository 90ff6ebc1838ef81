"""The prompt-only rule: what the verified matcher serves when the backend's answers cannot
vouch (calibration.py: "blind", or not yet shown to separate).

It trusts prompts alone, strictly (`PromptRule.pick`):
- the candidate's prompt cosine to the query clears `score`;
- no lexical guard fires (number, negation, order: what a sentence embedding cannot see);
- the query is clearly nearer the candidate than any rival by `margin`, where a rival is
  another cached prompt near the query whose own prompt is not a look-alike of the
  candidate's (prompt cosine to it under `kappa`): a query that sits between two groups of
  cached prompts may belong to either (a ratio test on prompts; it needs the candidates'
  vectors). No answer is read, so a backend whose answers tell nothing apart costs it nothing.

Calibration (labels score these figures, the rule never reads one): chosen on CLINC150 val +
oos_val (evals/tune.py), all-MiniLM-L6-v2, every miss stored: the lowest score at which the
rule is shown within the 1% budget over the whole stream (the 95% upper bound of its wrong
share, as the error budget bounds a level), since it serves with no answer to vouch. On val
that is 0.88 (601 hits, none wrong; 0.86 served 6 wrong of 694). Its figures do not depend on
the backend (it reads no answer); its figures on test are in docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from caches.matching.base import Candidate, Query
from caches.matching.lexical import first_violation


@dataclass(frozen=True)
class PromptRule:
    score: float = 0.88  # the candidate's prompt cosine to the query, at least
    margin: float = 0.0  # over the nearest rival, at least (0: no ratio test)
    kappa: float = 0.80  # a rival's prompt cosine to the candidate's, under this

    def __str__(self) -> str:
        if not self.margin:
            return f"cos>={self.score:.2f},guards"
        return f"cos>={self.score:.2f},guards,margin>={self.margin:.2f}/{self.kappa:.2f}"

    @property
    def needs_vectors(self) -> bool:
        return self.margin > 0

    def pick(self, q: Query, cands: Sequence[Candidate]) -> int:
        """The first entry among `cands` (best score first) the rule serves, else -1."""
        for i, c in enumerate(cands):
            if c.score < self.score:
                return -1
            if c.kind != "entry" or first_violation(q.prompt, c.prompt) is not None:
                continue
            return i if self._clear(i, cands) else -1
        return -1

    def _clear(self, i: int, cands: Sequence[Candidate]) -> bool:
        if not self.margin:
            return True
        c = cands[i]
        if c.vector is None:
            return False  # no vectors to tell rivals from look-alikes: not clearly safe
        rival = max(
            (
                n.score
                for j, n in enumerate(cands)
                if j != i and n.vector is not None and float(n.vector @ c.vector) < self.kappa
            ),
            default=0.0,
        )
        return c.score - rival >= self.margin


DEFAULT_FALLBACK = PromptRule()  # no ratio test: it moved nothing on CLINC150
